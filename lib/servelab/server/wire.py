"""The frames the API server and the engine core exchange: ``4-byte length + pickle``.

One Unix socket pair joins the two processes (:mod:`servelab.server.core`,
:mod:`servelab.server.client`); both read and write these frames.
"""
from __future__ import annotations

import pickle
import struct

__all__ = ["frame", "parse_frames"]

_HEADER = struct.Struct("<I")


def frame(obj) -> bytes:
    """``obj`` pickled, behind its length."""
    data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return _HEADER.pack(len(data)) + data


def parse_frames(buf: bytearray) -> list:
    """Complete frames at the start of ``buf`` (removed from it), decoded."""
    out, pos, n = [], 0, len(buf)
    while n - pos >= 4:
        size = _HEADER.unpack_from(buf, pos)[0]
        if n - pos - 4 < size:
            break
        out.append(pickle.loads(bytes(buf[pos + 4:pos + 4 + size])))
        pos += 4 + size
    if pos:
        del buf[:pos]
    return out
