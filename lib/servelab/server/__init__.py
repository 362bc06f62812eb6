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
* ``front.py``       - ``EngineFront``: the one face the app drives, whichever runs the engine;
* ``engine_loop.py`` - the one loop that owns the engine (a thread, or the core's main loop);
* ``core.py``        - the engine core's process (and ``build_engine``);
* ``client.py``      - the API server's handle on that process;
* ``wire.py``        - the frames the two processes exchange;
* ``metrics.py``     - Prometheus counters and histograms;
* ``app.py``         - the FastAPI endpoints and server-sent events;
* ``runner.py``      - building an engine from a checkpoint, and running the app.

The names below load their module on first use, so the engine core's process
(``python -m servelab.server.core``) imports neither FastAPI nor uvicorn.
"""
from servelab._lazy import lazy_exports

_EXPORTS = {
    "ServerSettings": "app", "create_app": "app", "sse": "app",
    "EngineCoreClient": "client", "EngineFront": "front", "build_engine": "core",
    "EngineLoop": "engine_loop", "EngineLost": "engine_loop", "Event": "engine_loop",
    "APIError": "errors", "error_body": "errors",
    "ServerMetrics": "metrics",
    "Limits": "protocol", "ParsedRequest": "protocol", "encode_chat": "protocol", "parse_request": "protocol",
    "ServerProcess": "runner", "ServerThread": "runner", "free_port": "runner", "launch": "runner",
}
__all__ = list(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, {name: f"servelab.server.{m}" for name, m in _EXPORTS.items()})
