"""Exceptions raised by the SDK.

Every API error answer (``{"error": {"code", "message", "field"}}``) becomes an
:class:`AutodlError` subclass chosen by HTTP status (and, for a few well-known codes, by
``code``), so callers can ``except autodl.NotFound`` instead of inspecting status codes, and
the server's own message is what they see.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Type


class AutodlError(Exception):
    """Base of every error raised by the SDK.

    ``status`` is the HTTP status (``None`` for errors detected on the client side),
    ``code`` the server's machine-readable code, ``message`` its human sentence and ``field``
    the request field it refers to, when any.
    """

    def __init__(
        self,
        message: str,
        *,
        status: Optional[int] = None,
        code: Optional[str] = None,
        field: Optional[str] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code
        self.field = field

    def __str__(self) -> str:
        if self.status is None:
            return self.message
        detail = f"HTTP {self.status}"
        if self.code:
            detail += f" {self.code}"
        if self.field:
            detail += f", field {self.field}"
        return f"{self.message} ({detail})"

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(message={self.message!r}, status={self.status!r}, "
            f"code={self.code!r}, field={self.field!r})"
        )


class ValidationError(AutodlError, ValueError):
    """400: the request was refused as invalid (also raised for client-side checks, with
    ``status`` None). Also a ``ValueError`` so generic validation handlers catch it."""


class Unschedulable(ValidationError):
    """400 with code ``unschedulable``: the request can never fit the cluster."""


class AuthenticationError(AutodlError):
    """401: missing, wrong, expired or revoked API key or token."""


class PermissionDenied(AutodlError):
    """403: authenticated, but not allowed (role, or quota)."""


class QuotaExceeded(PermissionDenied):
    """403 with code ``quota``: outside the organization's or user's quota."""


class NotFound(AutodlError):
    """404: no such resource in the caller's organization (or no such endpoint)."""


class Conflict(AutodlError):
    """409: the resource's current state forbids the operation (e.g. cancelling a finished
    task)."""


class RateLimited(AutodlError):
    """429: too many attempts; ``retry_after`` holds the server's hint in seconds."""

    def __init__(self, message: str, *, retry_after: Optional[float] = None, **kw: Any) -> None:
        super().__init__(message, **kw)
        self.retry_after = retry_after


class ServerError(AutodlError):
    """5xx: the server failed; the request may be retried later."""


class AutodlConnectionError(AutodlError):
    """The server could not be reached (refused, DNS, TLS, timeout)."""


class TaskTimeout(AutodlError, TimeoutError):
    """``Task.wait`` ran out of time before the task finished."""


class UnsafeArchive(AutodlError):
    """A results archive holds a member that would land outside the target directory."""


_BY_STATUS: Dict[int, Type[AutodlError]] = {
    400: ValidationError,
    401: AuthenticationError,
    403: PermissionDenied,
    404: NotFound,
    409: Conflict,
    422: ValidationError,
    429: RateLimited,
}

_BY_CODE: Dict[str, Type[AutodlError]] = {
    "unschedulable": Unschedulable,
    "quota": QuotaExceeded,
}


def error_class(status: int, code: Optional[str]) -> Type[AutodlError]:
    """The exception class for an error answer: by code when it refines the status's class,
    otherwise by status."""
    by_status = _BY_STATUS.get(status)
    if by_status is None:
        by_status = ServerError if status >= 500 else AutodlError
    refined = _BY_CODE.get(code or "")
    if refined is not None and issubclass(refined, by_status):
        return refined
    return by_status


def error_from_response(status: int, body: Any) -> AutodlError:
    """The exception for an error answer's status and decoded JSON body (as the server
    refuses a WebSocket handshake, for example)."""
    err = body.get("error") if isinstance(body, dict) else None
    err = err if isinstance(err, dict) else {}
    message = str(err["message"]) if isinstance(err.get("message"), str) else f"HTTP {status}"
    code = err.get("code") if isinstance(err.get("code"), str) else None
    field = err.get("field") if isinstance(err.get("field"), str) else None
    return error_class(status, code)(message, status=status, code=code, field=field)
