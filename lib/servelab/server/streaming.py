"""Moved: the stop-string holdback has one home, :mod:`servelab.engine.stop`
(:class:`~servelab.engine.stop.StopStringStreamer`, :func:`~servelab.engine.stop.holdback_stream`),
the rule the engine streams with. These names stay importable from here until the
last importer (the exercise 1 grader) reads them from there."""
from servelab.engine.stop import StopStringStreamer, holdback_stream

__all__ = ["StopStringStreamer", "holdback_stream"]
