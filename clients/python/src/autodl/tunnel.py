"""Reaching into running tasks through the server: one-shot commands, shells and ports.

Nothing here talks to a node: every tunnel is a WebSocket to the server, which checks the
caller and joins it to the node's agent. An exec tunnel's binary frames start with a channel
byte (0 stdin, 1 stdout, 2 stderr); its text frames are JSON control messages (``resize``,
``eof``, ``exit``, ``error``). A port tunnel carries the connection's bytes alone.
"""

from __future__ import annotations

import json
import os
import select
import socket
import sys
import threading
from dataclasses import dataclass
from typing import IO, Any, Callable, Dict, List, Optional, Sequence
from urllib.parse import urlencode

from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from .errors import AutodlConnectionError, AutodlError, error_from_response

STDIN, STDOUT, STDERR = 0, 1, 2

#: Largest frame accepted from the server (it sends at most 32 KiB of output per frame).
MAX_FRAME = 1 << 20


@dataclass
class ExecResult:
    """What a command run with :meth:`autodl.Client.exec` printed, and how it ended."""

    exit_code: int
    stdout: str
    stderr: str


def _ws_url(base_url: str, path: str, params: Dict[str, Any]) -> str:
    url = base_url.rstrip("/")
    if url.startswith("https://"):
        url = "wss://" + url[len("https://") :]
    elif url.startswith("http://"):
        url = "ws://" + url[len("http://") :]
    query = urlencode({k: v for k, v in params.items() if v is not None})
    return f"{url}/api/v1{path}" + (f"?{query}" if query else "")


def open_tunnel(
    base_url: str, api_key: Optional[str], path: str, params: Dict[str, Any]
) -> ClientConnection:
    """Opens the WebSocket; the server's refusal becomes the SDK's usual exception."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        # Entered by hand: newer websockets hand back the connection on entering the value
        # `connect` returns, older ones return the connection itself (entering it is a
        # no-op); the caller closes it.
        return connect(
            _ws_url(base_url, path, params),
            additional_headers=headers,
            max_size=MAX_FRAME,
            open_timeout=30,
            compression=None,
        ).__enter__()
    except InvalidStatus as exc:
        response = exc.response
        try:
            body = json.loads(response.body or b"{}")
        except ValueError:
            body = {}
        raise error_from_response(response.status_code, body) from None
    except OSError as exc:
        raise AutodlConnectionError(f"cannot reach {base_url}: {exc}") from None


def _control(message: Dict[str, Any]) -> str:
    return json.dumps(message)


def _finish(message: str) -> Optional[int]:
    """The exit code a control message announces (raises on an error message)."""
    try:
        c = json.loads(message)
    except ValueError:
        return None
    if c.get("type") == "exit":
        return int(c.get("code", -1))
    if c.get("type") == "error":
        raise AutodlError(str(c.get("message", "the tunnel failed")))
    return None


def _read_until_end(
    ws: ClientConnection,
    on_stdout: Callable[[bytes], None],
    on_stderr: Callable[[bytes], None],
    what: str,
) -> int:
    """Hands each output frame to its callback until the far side ends; returns the exit
    code it announced (raises when it ended without one, or with an error)."""
    code: Optional[int] = None
    try:
        for frame in ws:
            if isinstance(frame, bytes):
                if frame[:1] == bytes([STDOUT]):
                    on_stdout(frame[1:])
                elif frame[:1] == bytes([STDERR]):
                    on_stderr(frame[1:])
            else:
                done = _finish(frame)
                if done is not None:
                    code = done
    except ConnectionClosed:
        pass
    if code is None:
        raise AutodlError(f"the tunnel closed before the {what} ended")
    return code


def run_exec(
    ws: ClientConnection,
    *,
    stdin: Optional[bytes] = None,
    on_stdout: Callable[[bytes], None],
    on_stderr: Callable[[bytes], None],
) -> int:
    """Sends ``stdin`` (then the end of input), hands output to the callbacks, returns the
    exit code."""
    with ws:
        if stdin is not None:
            for i in range(0, len(stdin), 32 * 1024):
                ws.send(bytes([STDIN]) + stdin[i : i + 32 * 1024])
            ws.send(_control({"type": "eof"}))
        return _read_until_end(ws, on_stdout, on_stderr, "command")


def exec_collect(ws: ClientConnection, stdin: Optional[bytes] = None) -> ExecResult:
    out: List[bytes] = []
    err: List[bytes] = []
    code = run_exec(ws, stdin=stdin, on_stdout=out.append, on_stderr=err.append)
    return ExecResult(
        exit_code=code,
        stdout=b"".join(out).decode("utf-8", "replace"),
        stderr=b"".join(err).decode("utf-8", "replace"),
    )


def terminal_size() -> Sequence[int]:
    try:
        size = os.get_terminal_size(sys.stdout.fileno())
        return size.columns, size.lines
    except OSError:
        return 80, 24


def interactive(ws: ClientConnection, stdin: IO[bytes], stdout: IO[bytes]) -> int:
    """Joins the local terminal to a remote one until the remote side ends. On a real
    terminal the keys go through raw (Ctrl-C reaches the remote program); from a pipe, the
    end of input is a Ctrl-D."""
    fd = stdin.fileno()
    is_tty = os.isatty(fd)
    saved = None
    if is_tty:
        import termios
        import tty

        saved = termios.tcgetattr(fd)
        tty.setraw(fd)
        try:
            import signal

            def resized(*_: Any) -> None:
                cols, rows = terminal_size()
                try:
                    ws.send(_control({"type": "resize", "cols": cols, "rows": rows}))
                except ConnectionClosed:
                    pass

            signal.signal(signal.SIGWINCH, resized)
        except (ImportError, ValueError, AttributeError):
            pass
    stop = threading.Event()

    def keys() -> None:
        while not stop.is_set():
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:
                continue
            data = os.read(fd, 4096)
            try:
                ws.send(bytes([STDIN]) + (data if data else b"\x04"))
            except ConnectionClosed:
                return
            if not data:
                return

    reader = threading.Thread(target=keys, daemon=True)
    reader.start()

    def show(data: bytes) -> None:
        stdout.write(data)
        stdout.flush()

    try:
        return _read_until_end(ws, show, show, "shell")
    finally:
        stop.set()
        if saved is not None:
            import termios

            termios.tcsetattr(fd, termios.TCSADRAIN, saved)


def _pump_socket_to_ws(conn: socket.socket, ws: ClientConnection) -> None:
    try:
        while True:
            data = conn.recv(32 * 1024)
            if not data:
                break
            ws.send(data)
    except (OSError, ConnectionClosed):
        pass
    finally:
        try:
            ws.close()
        except ConnectionClosed:
            pass


def forward_connection(conn: socket.socket, open_ws: Callable[[], ClientConnection]) -> None:
    """Carries one local connection through its own tunnel until either side closes."""
    with conn:
        try:
            ws = open_ws()
        except AutodlError as exc:
            sys.stderr.write(f"autodl: port-forward: {exc}\n")
            return
        up = threading.Thread(target=_pump_socket_to_ws, args=(conn, ws), daemon=True)
        up.start()
        try:
            for frame in ws:
                if isinstance(frame, bytes):
                    conn.sendall(frame)
                else:
                    _finish(frame)
        except AutodlError as exc:
            sys.stderr.write(f"autodl: port-forward: {exc}\n")
        except (OSError, ConnectionClosed):
            pass
        finally:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            ws.close()


def serve_forward(
    listener: socket.socket,
    open_ws: Callable[[], ClientConnection],
    stop: Optional[threading.Event] = None,
) -> None:
    """Accepts local connections until ``stop`` is set, each in a thread."""
    listener.settimeout(0.5)
    while stop is None or not stop.is_set():
        try:
            conn, _ = listener.accept()
        except socket.timeout:
            continue
        except OSError:
            return
        conn.settimeout(None)
        threading.Thread(target=forward_connection, args=(conn, open_ws), daemon=True).start()
