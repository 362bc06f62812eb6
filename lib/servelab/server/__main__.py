"""``python -m servelab.server --model data/models/servelab-main --port 8000``."""
import sys

from servelab.server.runner import main

if __name__ == "__main__":
    sys.exit(main())
