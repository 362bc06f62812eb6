"""Grading isolation: the student's functions run in their kernel, the hidden
checks run in the grader's process.

A notebook's code may replace anything in its own process, the grading code
included (``servelab.grading.grade_question = lambda *a: full_marks``). So the
grader never asks the kernel for a verdict. It asks for *values*: the hidden
checks run here, in the grader, against :class:`Remote` stand-ins for the
student's functions. Calling a stand-in sends the arguments to the kernel over a
local socket, runs the student's function there and sends the result back as
plain data (numbers, strings, lists, dicts, arrays, tensors). Anything else the
student returns (an object of their class, a generator, a bound method) stays in
the kernel and comes back as another stand-in, whose attributes and methods are
fetched the same way. Functions that a check passes *into* student code (a step
function, a callback) stay here and are called back over the same socket.

What comes from the kernel is decoded as JSON only (never unpickled), so student
code can at most return wrong values, which is what grading measures. Lists and
dicts passed as arguments are written back after a call, so a check can still
see whether the student's function changed its input.
"""
from __future__ import annotations

import base64
import builtins
import json
import pickle
import socket
import struct
from typing import Any

GRADER, KERNEL = "grader", "kernel"

# ------------------------------------------------------------------ framing


def _send(sock: socket.socket, message: dict) -> None:
    data = json.dumps(message).encode()
    sock.sendall(struct.pack(">I", len(data)) + data)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    chunks, left = [], n
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            raise ConnectionError("the other side closed the connection")
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _recv(sock: socket.socket) -> dict:
    (n,) = struct.unpack(">I", _recv_exact(sock, 4))
    return json.loads(_recv_exact(sock, n))


# ------------------------------------------------------------------ stand-ins

_OWN_ATTRS = ("_peer", "_ref")


class Remote:
    """A stand-in for an object that lives on the other side of the socket."""

    __slots__ = _OWN_ATTRS

    def __init__(self, peer: "Peer", ref: int):
        object.__setattr__(self, "_peer", peer)
        object.__setattr__(self, "_ref", ref)

    def _ask(self, op: str, *args: Any) -> Any:
        return self._peer.request(op, self, *args)

    def __call__(self, *args, **kwargs):
        return self._peer.call(self, args, kwargs)

    def __getattr__(self, name: str):
        if name in _OWN_ATTRS:
            raise AttributeError(name)
        return self._ask("getattr", name)

    def __setattr__(self, name: str, value: Any) -> None:
        self._ask("setattr", name, value)

    def __len__(self):
        return self._ask("len")

    def __iter__(self):
        return self._ask("iter")

    def __next__(self):
        return self._ask("next")

    def __getitem__(self, key):
        return self._ask("getitem", key)

    def __setitem__(self, key, value):
        self._ask("setitem", key, value)

    def __contains__(self, item):
        return self._ask("contains", item)

    def __bool__(self):
        return self._ask("bool")

    def __eq__(self, other):
        return self._ask("eq", other)

    def __ne__(self, other):
        return self._ask("ne", other)

    def __lt__(self, other):
        return self._ask("lt", other)

    def __le__(self, other):
        return self._ask("le", other)

    def __gt__(self, other):
        return self._ask("gt", other)

    def __ge__(self, other):
        return self._ask("ge", other)

    def __float__(self):
        return self._ask("float")

    def __int__(self):
        return self._ask("int")

    def __index__(self):
        return self._ask("index")

    def __hash__(self):
        return self._ask("hash")

    def __repr__(self):
        try:
            return self._ask("repr")
        except Exception:  # a broken __repr__ in student code
            return "<object>"

    def __str__(self):
        return self._ask("str")

    def __copy__(self):
        return self

    def __deepcopy__(self, memo):
        return self


_OPS = {
    "getattr": getattr, "setattr": setattr, "len": len, "iter": iter, "next": next,
    "getitem": lambda o, k: o[k], "setitem": lambda o, k, v: o.__setitem__(k, v),
    "contains": lambda o, x: x in o, "bool": bool, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b,
    "lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b, "ge": lambda a, b: a >= b,
    "float": float, "int": int, "index": lambda o: o.__index__(), "hash": hash,
    "repr": repr, "str": str,
}

_SURROGATES: dict[tuple[str, str], type] = {}


def _surrogate(name: str, bases: list[str]) -> type:
    """An exception class named like the remote one, derived from its nearest builtin base."""
    base = next((b for b in (getattr(builtins, n, None) for n in bases)
                 if isinstance(b, type) and issubclass(b, BaseException)), Exception)
    if base.__name__ == name:
        return base
    key = (name, base.__name__)
    if key not in _SURROGATES:
        _SURROGATES[key] = type(name, (base,), {"__module__": "student"})
    return _SURROGATES[key]


class Peer:
    """One end of the socket: sends requests, answers the other side's requests."""

    def __init__(self, sock: socket.socket, side: str, namespace: dict | None = None):
        self.sock, self.side, self.namespace = sock, side, namespace
        self.objects: dict[int, Any] = {}
        self.closed = False

    # ---------------------------------------------------------------- encoding
    def _keep(self, obj: Any) -> dict:
        self.objects[id(obj)] = obj
        return {"t": "ref", "owner": self.side, "id": id(obj)}

    def encode(self, x: Any, depth: int = 0) -> Any:
        if depth > 50:
            raise ValueError("a value nested more than 50 levels deep cannot be sent")
        if x is None or isinstance(x, (bool, str)):
            return x
        if type(x) is int:
            return x
        if type(x) is float:
            return x  # Python's JSON writes inf and nan (as Infinity, NaN) and reads them back
        if isinstance(x, Remote):
            return {"t": "ref", "owner": GRADER if self.side == KERNEL else KERNEL, "id": x._ref}
        enc = lambda v: self.encode(v, depth + 1)  # noqa: E731
        if type(x) is list:
            return {"t": "list", "v": [enc(v) for v in x]}
        if isinstance(x, tuple):
            if hasattr(x, "_fields") and type(x) is not tuple:
                return {"t": "ntuple", "name": type(x).__name__, "fields": list(x._fields),
                        "v": [enc(v) for v in x]}
            if type(x) is tuple:
                return {"t": "tuple", "v": [enc(v) for v in x]}
        if type(x) is dict:
            return {"t": "dict", "v": [[enc(k), enc(v)] for k, v in x.items()]}
        if type(x) in (set, frozenset):
            return {"t": type(x).__name__, "v": [enc(v) for v in x]}
        if type(x) is bytes:
            return {"t": "bytes", "v": base64.b64encode(x).decode()}
        module = type(x).__module__.split(".")[0]
        if module == "numpy":
            if type(x).__name__ == "ndarray":
                return {"t": "ndarray", "v": enc(x.tolist()), "dtype": str(x.dtype), "shape": list(x.shape)}
            if hasattr(x, "dtype") and hasattr(x, "item"):
                return {"t": "npscalar", "v": enc(x.item()), "dtype": str(x.dtype)}
        if module == "torch" and type(x).__name__ in ("Tensor", "Parameter"):
            t = x.detach().cpu()
            return {"t": "tensor", "v": enc(t.tolist()), "dtype": str(t.dtype).removeprefix("torch."),
                    "shape": list(t.shape)}
        if isinstance(x, int) and not isinstance(x, bool) and type(x).__module__ == "builtins":
            return int(x)
        if self.side == GRADER and not callable(x):
            try:  # the grader's own data (configs, dataclasses): the kernel may unpickle it
                return {"t": "pickle", "v": base64.b64encode(pickle.dumps(x)).decode()}
            except Exception:
                pass
        return self._keep(x)

    def decode(self, x: Any) -> Any:
        if not isinstance(x, dict):
            return x
        t, v = x["t"], x.get("v")
        if t == "list":
            return [self.decode(e) for e in v]
        if t == "tuple":
            return tuple(self.decode(e) for e in v)
        if t == "ntuple":
            import collections
            return collections.namedtuple(x["name"], x["fields"])(*(self.decode(e) for e in v))
        if t == "dict":
            return {self.decode(k): self.decode(e) for k, e in v}
        if t in ("set", "frozenset"):
            return (set if t == "set" else frozenset)(self.decode(e) for e in v)
        if t == "bytes":
            return base64.b64decode(v)
        if t == "ndarray":
            import numpy as np
            return np.array(self.decode(v), dtype=x["dtype"]).reshape(x["shape"])
        if t == "npscalar":
            import numpy as np
            return np.dtype(x["dtype"]).type(self.decode(v))
        if t == "tensor":
            import torch
            return torch.tensor(self.decode(v), dtype=getattr(torch, x["dtype"])).reshape(x["shape"])
        if t == "pickle":
            if self.side != KERNEL:
                raise ValueError("the grader never unpickles what the kernel sends")
            return pickle.loads(base64.b64decode(v))
        if t == "ref":
            if x["owner"] == self.side:
                return self.objects[x["id"]]
            return Remote(self, x["id"])
        raise ValueError(f"unknown value tag {t!r}")

    def _encode_exc(self, exc: BaseException) -> dict:
        origin = getattr(exc, "_servelab_origin", None)
        if origin is not None and origin[0] != self.side:
            return {"owner": origin[0], "id": origin[1]}  # the other side's own exception, passing back
        self.objects[id(exc)] = exc
        return {"owner": self.side, "id": id(exc), "type": type(exc).__name__,
                "bases": [c.__name__ for c in type(exc).__mro__ if c.__module__ == "builtins"],
                "message": str(exc)[:2000]}

    def _decode_exc(self, e: dict) -> BaseException:
        if e["owner"] == self.side:
            return self.objects[e["id"]]
        exc = _surrogate(e["type"], e["bases"])(e["message"])
        exc._servelab_origin = (e["owner"], e["id"])
        return exc

    # ---------------------------------------------------------------- protocol
    def request(self, op: str, *args: Any) -> Any:
        return self._exchange({"op": op, "args": [self.encode(a) for a in args]}, None)

    def call(self, target: Any, args: tuple, kwargs: dict) -> Any:
        message = {"op": "call", "target": self.encode(target), "args": [self.encode(a) for a in args],
                   "kwargs": {k: self.encode(v) for k, v in kwargs.items()}}
        return self._exchange(message, args)

    def _exchange(self, message: dict, args: tuple | None) -> Any:
        if self.closed:
            raise ConnectionError("the kernel is no longer answering")
        _send(self.sock, message)
        while True:
            reply = _recv(self.sock)
            if "op" in reply:  # the other side calls back while working on ours
                _send(self.sock, self._perform(reply))
                continue
            if "exc" in reply:
                raise self._decode_exc(reply["exc"])
            for index, value in reply.get("wb", []):  # the call changed a list or dict argument
                original, new = args[index], self.decode(value)
                if type(original) is list:
                    original[:] = new
                elif type(original) is dict:
                    original.clear()
                    original.update(new)
            return self.decode(reply["ok"])

    def _perform(self, message: dict) -> dict:
        try:
            op = message["op"]
            if op == "call":
                target = self.decode(message["target"])
                args = [self.decode(a) for a in message["args"]]
                kwargs = {k: self.decode(v) for k, v in message["kwargs"].items()}
                result = target(*args, **kwargs)
                wb = [[i, self.encode(a)] for i, a in enumerate(args) if type(a) in (list, dict)]
                return {"ok": self.encode(result), "wb": wb}
            args = [self.decode(a) for a in message["args"]]
            if op == "global":
                return {"ok": self.encode(self.namespace.get(args[0]) if self.namespace is not None else None)}
            if op == "release":
                self.objects.clear()
                return {"ok": None}
            return {"ok": self.encode(_OPS[op](*args))}
        except BaseException as exc:  # student code may raise anything, KeyboardInterrupt included
            return {"exc": self._encode_exc(exc)}

    def serve(self) -> None:
        """Answer requests until the other side says goodbye or goes away."""
        try:
            while True:
                try:
                    message = _recv(self.sock)
                except (ConnectionError, OSError):
                    return
                if message.get("op") == "bye":
                    return
                _send(self.sock, self._perform(message))
        finally:
            self.sock.close()


def serve_kernel(path: str, namespace: dict) -> None:
    """Run inside the student's kernel: connect to the grader at ``path`` and answer."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    Peer(sock, KERNEL, namespace).serve()


KERNEL_CODE = ("__import__('servelab.grading.remote', fromlist=['serve_kernel'])"
               ".serve_kernel({path!r}, globals())")
