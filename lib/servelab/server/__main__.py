"""``python -m servelab.server --model data/models/servelab-main --port 8000``."""
import logging
import os
import sys

from servelab.server.runner import main

if __name__ == "__main__":
    code = main()
    # everything is served and closed: skip the interpreter's teardown of torch, which
    # takes seconds on a small machine and would delay the exit a supervisor waits for
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
