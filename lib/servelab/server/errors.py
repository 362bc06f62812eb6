"""OpenAI-shaped errors: one exception type, one JSON body.

Every refusal the server makes is an :class:`APIError` carrying the HTTP
status and OpenAI's error body ``{"error": {"message", "type", "param",
"code"}}``; the message names the field, the limit and the fix.
"""
from __future__ import annotations

__all__ = ["APIError", "bad_request", "error_body"]

#: HTTP status -> OpenAI's error ``type``.
ERROR_TYPES = {
    400: "invalid_request_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    500: "internal_server_error",
    503: "service_unavailable",
}


def error_body(message: str, status: int = 400, param: str | None = None,
               code: str | None = None) -> dict:
    """OpenAI's error object."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"),
                      "param": param, "code": code}}


class APIError(Exception):
    """A request the server refuses (or fails), with its HTTP status and OpenAI body."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.headers = dict(headers or {})

    def body(self) -> dict:
        return error_body(self.message, self.status, self.param, self.code)


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> APIError:
    """A 400 naming the offending field."""
    return APIError(400, message, param=param, code=code)
