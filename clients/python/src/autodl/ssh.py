"""Plain ``ssh`` (and editors that speak it, such as VS Code Remote-SSH) into a running task.

No node runs an SSH server and no port of a node is opened: ``autodl ssh-config TASK`` writes
a ``Host`` entry whose ``ProxyCommand`` is ``autodl ssh-proxy TASK``. That proxy runs on the
person's own machine, speaks SSH to their ``ssh`` over its standard input and output, and
carries each thing ``ssh`` asks for through the server's checked tunnels, as the other
commands do: a shell (``/shell``), a command (``/exec``, on a terminal with ``-t``), and a
forwarded connection (``-L``, to a port the task declared). The proxy holds the person's API
key already, so the SSH login itself asks for nothing; its host key is kept beside the CLI's
profiles, so ``ssh`` knows it from one connection to the next.
"""

from __future__ import annotations

import json
import os
import shlex
import socket
import sys
import threading
from pathlib import Path
from typing import Any, Dict, Optional, Tuple

from websockets.exceptions import ConnectionClosed

from .errors import AutodlError
from .tunnel import STDERR, STDIN, STDOUT, _control, _finish

#: A command's output arrives in frames of at most this many bytes.
CHUNK = 32 * 1024

#: Carries one TCP connection to a port inside the task over a command's input and output,
#: for ports the task did not declare (an editor's own server, as VS Code's): reaching them
#: this way needs nothing an `exec` does not already allow.
RELAY = """
import os, socket, sys, threading
s = socket.create_connection(("127.0.0.1", int(sys.argv[1])))
def up():
    while True:
        d = os.read(0, 65536)
        if not d:
            break
        s.sendall(d)
    s.shutdown(socket.SHUT_WR)
threading.Thread(target=up, daemon=True).start()
out = sys.stdout.buffer
while True:
    d = s.recv(65536)
    if not d:
        break
    out.write(d)
    out.flush()
"""


def _paramiko() -> Any:
    try:
        import paramiko
    except ImportError:  # pragma: no cover - the extra is missing
        raise AutodlError(
            "ssh needs paramiko: pip install 'autodl[ssh]' (or pip install paramiko)"
        ) from None
    return paramiko


def config_dir() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "autodl"


def host_key(path: Optional[Path] = None) -> Any:
    """The proxy's own host key, made once (only the person may read it)."""
    paramiko = _paramiko()
    path = path or config_dir() / "ssh_host_key"
    if path.exists():
        return paramiko.RSAKey.from_private_key_file(str(path))
    path.parent.mkdir(parents=True, exist_ok=True)
    key = paramiko.RSAKey.generate(2048)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        key.write_private_key(f)
    os.replace(tmp, path)
    return key


def host_alias(task: str) -> str:
    """The name ``ssh`` knows a task by: ``autodl-<task>`` (``#`` left out)."""
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in task.lstrip("#"))
    return f"autodl-{safe}"


def config_entry(alias: str, task_id: str, api_url: str) -> str:
    """The ``Host`` entry for ``~/.ssh/config`` that reaches the task through this CLI: its
    key comes from the CLI's profile (``autodl login``) or ``AUTODL_API_KEY``, never from the
    file."""
    command = [sys.executable, "-m", "autodl.cli", "ssh-proxy", task_id, "--api-url", api_url]
    profile = os.environ.get("AUTODL_PROFILE")
    if profile:
        command = ["env", f"AUTODL_PROFILE={profile}"] + command
    known = config_dir() / "known_hosts"
    return (
        f"Host {alias}\n"
        f"  HostName {alias}\n"
        f"  User autodl\n"
        f"  ProxyCommand {' '.join(shlex.quote(c) for c in command)}\n"
        f"  UserKnownHostsFile {shlex.quote(str(known))}\n"
        f"  StrictHostKeyChecking accept-new\n"
        f"  PasswordAuthentication no\n"
        f"  PubkeyAuthentication no\n"
    )


class _Server:
    """What the proxy grants: a login without a password (whoever runs it holds the key),
    sessions, and connections to the task's declared ports."""

    def __init__(self, proxy: "Proxy") -> None:
        paramiko = _paramiko()
        self.paramiko = paramiko
        self.proxy = proxy
        self.terminals: Dict[int, Tuple[int, int]] = {}
        self.sockets: Dict[int, Any] = {}

    # paramiko.ServerInterface, by name (mixed in below).
    def get_allowed_auths(self, username: str) -> str:
        return "none"

    def check_auth_none(self, username: str) -> int:
        return self.paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind: str, chanid: int) -> int:
        if kind == "session":
            return self.paramiko.OPEN_SUCCEEDED
        return self.paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_direct_tcpip_request(
        self, chanid: int, origin: Any, destination: Any
    ) -> int:
        host, port = destination
        if host not in ("localhost", "127.0.0.1", "::1") or not 0 < int(port) < 65536:
            return self.paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED
        try:
            if int(port) in self.proxy.declared:
                ws = self.proxy.open(f"ports/{int(port)}")
                relayed = False
            else:
                argv = ["python3", "-c", RELAY, str(int(port))]
                ws = self.proxy.open("exec", command=json.dumps(argv))
                relayed = True
        except AutodlError as exc:
            self.proxy.say(f"port {port}: {exc}")
            return self.paramiko.OPEN_FAILED_CONNECT_FAILED
        self.sockets[chanid] = (ws, relayed)
        return self.paramiko.OPEN_SUCCEEDED

    def check_channel_pty_request(
        self, channel: Any, term: Any, width: int, height: int, *_: Any
    ) -> bool:
        self.terminals[channel.get_id()] = (max(width, 1), max(height, 1))
        return True

    def check_channel_window_change_request(
        self, channel: Any, width: int, height: int, *_: Any
    ) -> bool:
        self.terminals[channel.get_id()] = (max(width, 1), max(height, 1))
        self.proxy.resize(channel.get_id(), width, height)
        return True

    def check_channel_shell_request(self, channel: Any) -> bool:
        return self.proxy.start(channel, None, self.terminals.get(channel.get_id()))

    def check_channel_exec_request(self, channel: Any, command: bytes) -> bool:
        text = command.decode("utf-8", "replace")
        return self.proxy.start(channel, text, self.terminals.get(channel.get_id()))

    def check_channel_env_request(self, channel: Any, name: bytes, value: bytes) -> bool:
        return False


class Proxy:
    """One ``ssh`` connection, carried to one task."""

    def __init__(
        self, client: Any, task: str, path_of: Any, declared: Any = (), log: Any = None
    ) -> None:
        self.client = client
        self.task = task
        #: The ports the task declared: reached directly; others through a relay.
        self.declared = {int(p) for p in declared}
        self.path_of = path_of
        self.log = log or sys.stderr
        self.tunnels: Dict[int, Any] = {}

    def say(self, message: str) -> None:
        try:
            self.log.write(f"autodl ssh-proxy: {message}\n")
            self.log.flush()
        except (OSError, ValueError):
            pass

    def open(self, what: str, **params: Any) -> Any:
        return self.client.tunnel(self.path_of(self.task, what), **params)

    def resize(self, chanid: int, cols: int, rows: int) -> None:
        ws = self.tunnels.get(chanid)
        if ws is not None:
            try:
                ws.send(_control({"type": "resize", "cols": max(cols, 1), "rows": max(rows, 1)}))
            except ConnectionClosed:
                pass

    def start(
        self, channel: Any, command: Optional[str], terminal: Optional[Tuple[int, int]]
    ) -> bool:
        """A shell (``command`` None) or a command, on a terminal when ``ssh`` asked for one."""
        try:
            if command is None:
                cols, rows = terminal or (80, 24)
                ws = self.open("shell", cols=cols, rows=rows)
            else:
                params: Dict[str, Any] = {"command": json.dumps(["/bin/sh", "-c", command])}
                if terminal:
                    params.update(tty="true", cols=terminal[0], rows=terminal[1])
                ws = self.open("exec", **params)
        except AutodlError as exc:
            self.say(str(exc))
            return False
        self.tunnels[channel.get_id()] = ws
        threading.Thread(target=self._session, args=(channel, ws), daemon=True).start()
        return True

    def _session(self, channel: Any, ws: Any) -> None:
        def keys() -> None:
            try:
                while True:
                    data = channel.recv(CHUNK)
                    if not data:
                        ws.send(_control({"type": "eof"}))
                        return
                    ws.send(bytes([STDIN]) + data)
            except (OSError, ConnectionClosed, EOFError):
                pass

        threading.Thread(target=keys, daemon=True).start()
        code = 255
        try:
            for frame in ws:
                if isinstance(frame, bytes):
                    if frame[:1] == bytes([STDOUT]):
                        channel.sendall(frame[1:])
                    elif frame[:1] == bytes([STDERR]):
                        channel.sendall_stderr(frame[1:])
                else:
                    try:
                        done = _finish(frame)
                    except AutodlError as exc:
                        channel.sendall_stderr(f"autodl: {exc}\r\n".encode())
                        done = None
                    if done is not None:
                        code = done
        except (OSError, ConnectionClosed, EOFError):
            pass
        finally:
            self.tunnels.pop(channel.get_id(), None)
            try:
                channel.send_exit_status(code)
                channel.shutdown_write()
                channel.close()
            except (OSError, EOFError):
                pass
            ws.close()

    def _forward(self, channel: Any, ws: Any, relayed: bool) -> None:
        """One forwarded connection: a port tunnel's bytes as they are, or a relay command's
        input and output (its frames carry a channel byte)."""

        def up() -> None:
            try:
                while True:
                    data = channel.recv(CHUNK)
                    if not data:
                        break
                    ws.send(bytes([STDIN]) + data if relayed else data)
                if relayed:
                    ws.send(_control({"type": "eof"}))
            except (OSError, ConnectionClosed, EOFError):
                pass
            finally:
                if not relayed:
                    ws.close()

        threading.Thread(target=up, daemon=True).start()
        try:
            for frame in ws:
                if isinstance(frame, bytes):
                    if not relayed:
                        channel.sendall(frame)
                    elif frame[:1] == bytes([STDOUT]):
                        channel.sendall(frame[1:])
                    elif frame[:1] == bytes([STDERR]):
                        self.say(frame[1:].decode("utf-8", "replace").strip())
                elif _finish(frame) is not None:
                    break
        except (OSError, ConnectionClosed, EOFError, AutodlError):
            pass
        finally:
            try:
                channel.close()
            except (OSError, EOFError):
                pass
            ws.close()

    def serve(self, sock: socket.socket, key: Any) -> None:
        """Speaks SSH on ``sock`` until ``ssh`` leaves."""
        paramiko = _paramiko()
        server_cls = type("AutodlSshServer", (_Server, paramiko.ServerInterface), {})
        server = server_cls(self)
        transport = paramiko.Transport(sock)
        transport.add_server_key(key)
        transport.start_server(server=server)
        while transport.is_active():
            channel = transport.accept(0.5)
            if channel is None:
                continue
            forward = server.sockets.pop(channel.get_id(), None)
            if forward is not None:
                ws, relayed = forward
                threading.Thread(
                    target=self._forward, args=(channel, ws, relayed), daemon=True
                ).start()
        transport.close()


def serve_stdio(proxy: Proxy, key: Any) -> int:
    """Joins standard input and output to the SSH conversation (as ``ProxyCommand`` runs)."""
    ours, theirs = socket.socketpair()
    stdin, stdout = sys.stdin.buffer.fileno(), sys.stdout.buffer.fileno()

    def inward() -> None:
        try:
            while True:
                data = os.read(stdin, CHUNK)
                if not data:
                    break
                ours.sendall(data)
        except OSError:
            pass
        finally:
            try:
                ours.shutdown(socket.SHUT_WR)
            except OSError:
                pass

    def outward() -> None:
        try:
            while True:
                data = ours.recv(CHUNK)
                if not data:
                    break
                view = memoryview(data)
                while view:
                    view = view[os.write(stdout, view) :]
        except OSError:
            pass

    threading.Thread(target=inward, daemon=True).start()
    out = threading.Thread(target=outward, daemon=True)
    out.start()
    proxy.serve(theirs, key)
    out.join(timeout=2)
    return 0
