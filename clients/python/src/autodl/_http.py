"""The one place that talks HTTP: base URL and auth, JSON in and out, error mapping.

Kept apart from :mod:`autodl.client` so the task, monitor and reporting code share one
behaviour for errors and so tests can inject an ``httpx`` transport.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterator, Mapping, Optional, Sequence, Tuple, Union

import httpx
from httpx_sse import EventSource, SSEError

from . import profiles
from ._version import __version__
from .errors import AutodlConnectionError, AutodlError, RateLimited, error_class

DEFAULT_API_URL = "http://127.0.0.1:8080"
API_PREFIX = "/api/v1"


def server_root(url: str) -> str:
    """The server's address as users write it: ``http://host:8080``, with or without a
    trailing slash, or the API's own address (``.../api/v1``, as curl examples show it)."""
    root = url.strip().rstrip("/")
    if root.endswith(API_PREFIX):
        root = root[: -len(API_PREFIX)].rstrip("/")
    return root


Params = Union[Mapping[str, Any], Sequence[Tuple[str, Any]], None]


def env_api_url() -> str:
    """The server address from ``AUTODL_API_URL``, else the saved profile (``autodl
    login``), else the local default."""
    return (
        os.environ.get("AUTODL_API_URL")
        or profiles.load_profile().get("api_url")
        or DEFAULT_API_URL
    )


def env_api_key() -> Optional[str]:
    """The API key from ``AUTODL_API_KEY``, else the saved profile's, if any."""
    return os.environ.get("AUTODL_API_KEY") or profiles.load_profile().get("api_key") or None


def error_from_response(response: httpx.Response) -> AutodlError:
    """Builds the exception for an error answer, keeping the server's message verbatim."""
    status = response.status_code
    code: Optional[str] = None
    field: Optional[str] = None
    message: Optional[str] = None
    try:
        body = response.json()
    except (ValueError, UnicodeDecodeError):
        body = None
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        code = err.get("code") if isinstance(err.get("code"), str) else None
        field = err.get("field") if isinstance(err.get("field"), str) else None
        if isinstance(err.get("message"), str):
            message = err["message"]
    if message is None:
        text = response.text.strip()
        message = f"HTTP {status} {response.reason_phrase}" + (f": {text[:300]}" if text else "")
    cls = error_class(status, code)
    if cls is RateLimited:
        retry_after: Optional[float] = None
        try:
            retry_after = float(response.headers.get("retry-after", ""))
        except ValueError:
            pass
        return RateLimited(message, retry_after=retry_after, status=status, code=code, field=field)
    return cls(message, status=status, code=code, field=field)


class HttpClient:
    """A thin wrapper over :class:`httpx.Client` that speaks the autodl conventions.

    Paths are relative to ``/api/v1``. Answers are decoded JSON (``None`` for 204); error
    answers raise :class:`~autodl.errors.AutodlError` subclasses; transport failures raise
    :class:`~autodl.errors.AutodlConnectionError` naming the server address.
    """

    def __init__(
        self,
        base_url: Optional[str] = None,
        token: Optional[str] = None,
        *,
        timeout: float = 30.0,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        self.base_url = server_root(base_url or env_api_url())
        self.token = token
        headers = {"User-Agent": f"autodl-python/{__version__}", "Accept": "application/json"}
        if token:
            headers["Authorization"] = f"Bearer {token}"
        self._client = httpx.Client(
            base_url=self.base_url + API_PREFIX,
            headers=headers,
            timeout=timeout,
            transport=transport,
        )

    def close(self) -> None:
        self._client.close()

    def _send(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Params = None,
        headers: Optional[Dict[str, str]] = None,
        stream: bool = False,
        timeout: Any = None,
    ) -> httpx.Response:
        kwargs: Dict[str, Any] = {"params": params, "headers": headers}
        if json_body is not None:
            kwargs["json"] = json_body
        if timeout is not None:
            kwargs["timeout"] = timeout
        try:
            request = self._client.build_request(method, path, **kwargs)
            response = self._client.send(request, stream=stream)
        except httpx.TimeoutException as exc:
            raise AutodlConnectionError(
                f"timed out talking to the autodl server at {self.base_url}: {exc}"
            ) from exc
        except httpx.TransportError as exc:
            raise AutodlConnectionError(
                f"cannot reach the autodl server at {self.base_url}: {exc}"
            ) from exc
        if response.status_code >= 400:
            if stream:
                response.read()
                response.close()
            raise error_from_response(response)
        return response

    def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        params: Params = None,
        headers: Optional[Dict[str, str]] = None,
    ) -> Any:
        """Sends one request and returns the decoded JSON answer (``None`` when empty)."""
        response = self._send(method, path, json_body=json_body, params=params, headers=headers)
        if response.status_code == 204 or not response.content:
            return None
        try:
            return response.json()
        except ValueError:
            return response.text

    def get(self, path: str, params: Params = None) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any = None, headers: Optional[Dict[str, str]] = None) -> Any:
        return self.request(
            "POST", path, json_body=body if body is not None else {}, headers=headers
        )

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    def send_bytes(self, method: str, path: str, data: bytes) -> Any:
        """Sends ``data`` as an octet-stream body (no timeout: it may be large)."""
        return self._send_content(method, path, data)

    def upload(self, path: str, fileobj: Any) -> Any:
        """Streams ``fileobj`` (a binary file) as the body of a PUT; returns the JSON answer."""
        return self._send_content("PUT", path, iter(lambda: fileobj.read(1 << 20), b""))

    def _send_content(self, method: str, path: str, content: Any) -> Any:
        try:
            request = self._client.build_request(
                method,
                path,
                content=content,
                headers={"Content-Type": "application/octet-stream"},
                timeout=None,
            )
            response = self._client.send(request)
        except httpx.TransportError as exc:
            raise AutodlConnectionError(
                f"upload to the autodl server at {self.base_url} failed: {exc}"
            ) from exc
        if response.status_code >= 400:
            raise error_from_response(response)
        return response.json() if response.content else None

    def download(self, path: str, fileobj: Any, params: Params = None) -> int:
        """Streams a binary answer into ``fileobj``; returns the number of bytes written."""
        response = self._send("GET", path, params=params, stream=True)
        written = 0
        try:
            for chunk in response.iter_bytes():
                fileobj.write(chunk)
                written += len(chunk)
        except httpx.TransportError as exc:
            raise AutodlConnectionError(f"download from {self.base_url} broke off: {exc}") from exc
        finally:
            response.close()
        return written

    def sse(self, path: str, params: Params = None) -> Iterator[Tuple[str, Dict[str, Any]]]:
        """Yields ``(event name, JSON data)`` for each Server-Sent Event until the server ends
        the stream (the name is ``"message"`` when the event has none). Reads without a
        timeout: a quiet training job may log nothing for minutes."""
        timeout = httpx.Timeout(self._client.timeout.connect, read=None)
        response = self._send(
            "GET",
            path,
            params=params,
            headers={"Accept": "text/event-stream"},
            stream=True,
            timeout=timeout,
        )
        try:
            # httpx-sse reads the stream as the SSE specification says (comments, multi-line
            # data, CR/LF/CRLF line ends, an unfinished last event dropped).
            for event in EventSource(response).iter_sse():
                parsed = _json_object(event.data)
                if parsed is not None:
                    yield event.event or "message", parsed
        except SSEError as exc:
            raise AutodlConnectionError(
                f"{self.base_url}{path} answered without an event stream: {exc}"
            ) from exc
        except httpx.TransportError as exc:
            raise AutodlConnectionError(
                f"log stream from {self.base_url} broke off: {exc}"
            ) from exc
        finally:
            response.close()


def _json_object(text: str) -> Optional[Dict[str, Any]]:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
