"""servelab.server: an OpenAI-compatible streaming server over the engine.

Start it from a shell::

    python -m servelab.server --model data/models/servelab-main --port 8000

or from Python: :func:`launch` (a background process, as chapter 1 does) or
:class:`ServerThread` (in this process, as the tests do). The command runs two
processes: the API server (HTTP, SSE, tokenizing) and the engine core (the
engine's busy loop), as vLLM's V1 does; ``--no-engine-process`` runs the
engine loop as a thread of the API server instead. Pieces, one per file:

* ``protocol.py``    - OpenAI's request fields checked, and its response shapes;
* ``errors.py``      - OpenAI's error body;
* ``engine_loop.py`` - the one loop that owns the engine (a thread, or the core's main loop);
* ``core.py``        - the engine core's process and the API server's client for it;
* ``metrics.py``     - Prometheus counters and histograms;
* ``app.py``         - the FastAPI endpoints and server-sent events;
* ``runner.py``      - building an engine from a checkpoint, and running the app.
"""
from servelab.server.app import ServerSettings, create_app, sse
from servelab.server.core import EngineCoreClient
from servelab.server.engine_loop import EngineLoop, Event
from servelab.server.errors import APIError, error_body
from servelab.server.metrics import ServerMetrics
from servelab.server.protocol import Limits, ParsedRequest, encode_chat, parse_request
from servelab.server.runner import ServerProcess, ServerThread, build_engine, free_port, launch

__all__ = ["ServerSettings", "create_app", "sse", "EngineLoop", "EngineCoreClient", "Event", "APIError", "error_body",
           "ServerMetrics", "Limits", "ParsedRequest", "encode_chat", "parse_request",
           "ServerProcess", "ServerThread", "build_engine", "free_port", "launch"]
