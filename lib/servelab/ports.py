"""A free TCP port, for a process group's rendezvous or a server started for a test or a notebook."""
from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS says nobody listens on right now (another process could take it before you do)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]
