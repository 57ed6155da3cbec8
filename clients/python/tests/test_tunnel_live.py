"""Sessions and tunnels against ``serve --demo``: a session running a small web server
(a page and a WebSocket echo) reached by ``autodl port-forward``; ``autodl exec`` and
``autodl shell`` round-trip through the server; another organization is refused."""

from __future__ import annotations

import fcntl
import os
import pty
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
import urllib.request

import pytest
from conftest import LiveServer, cli
from websockets.sync.client import connect

import autodl

pytestmark = pytest.mark.live

SERVER = """
import asyncio, sys
from websockets.asyncio.server import serve

async def echo(ws):
    async for message in ws:
        await ws.send(message)

def page(connection, request):
    if request.headers.get("Upgrade", "").lower() != "websocket":
        return connection.respond(200, "hello from the task\\n")

async def main():
    async with serve(echo, "127.0.0.1", int(sys.argv[1]), process_request=page):
        print("listening", flush=True)
        await asyncio.Future()

asyncio.run(main())
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(predicate, timeout: float = 60.0, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.3)
    pytest.fail(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def session(demo: LiveServer):
    client = demo.client()
    script = demo.code_dir / "webapp.py"
    script.write_text(SERVER)
    port = _free_port()
    task = client.submit_spec(
        {
            "name": "notebook",
            "image": "none",
            "kind": "session",
            "ports": [port],
            "command": ["python", str(script), str(port)],
            "resources": {"gpu": {"count": 1}},
        }
    )
    _wait(lambda: task.get_status() == "RUNNING", what="the session to run")
    _wait(lambda: "listening" in "".join(task.logs()), what="the web server")
    yield task, port
    task.cancel()


def test_exec_returns_output_and_exit_code(demo: LiveServer, session):
    task, _ = session
    r = demo.client().exec(task.id, ["sh", "-c", "echo hi $AUTODL_TASK_ID; echo oops >&2; exit 4"])
    assert (r.exit_code, r.stdout, r.stderr) == (4, f"hi {task.id}\n", "oops\n")
    assert task.exec(["cat"], stdin="piped\n").stdout == "piped\n"
    # The CLI gives the command's own exit status.
    done = cli(demo, "exec", task.id, "--", "sh", "-c", "echo from-cli; exit 3")
    assert done.returncode == 3 and done.stdout == "from-cli\n", done
    kinds = [e["kind"] for e in task.events()]
    assert "exec" in kinds


def test_shell_round_trips_input_and_output(demo: LiveServer, session):
    task, _ = session
    done = subprocess.run(
        [sys.executable, "-m", "autodl.cli", "shell", task.id],
        input="echo $((6*7)) from-the-shell\nexit 5\n",
        env=demo.cli_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "42 from-the-shell" in done.stdout, done
    assert done.returncode == 5, done
    assert "shell" in [e["kind"] for e in task.events()]


def _read_until(fd: int, want: str, timeout: float = 30.0) -> str:
    seen = b""
    deadline = time.monotonic() + timeout
    while want.encode() not in seen:
        left = deadline - time.monotonic()
        assert left > 0, f"no {want!r} in {seen!r}"
        ready, _, _ = select.select([fd], [], [], left)
        if ready:
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    return seen.decode(errors="replace")


def _set_size(fd: int, rows: int, cols: int) -> None:
    fcntl.ioctl(fd, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))


def test_shell_on_a_terminal_follows_resizes_and_passes_ctrl_c(demo: LiveServer, session):
    """``autodl shell`` on a real (pseudo) terminal, as a person runs it: the remote terminal
    has the local one's size and follows it when the window changes, and Ctrl-C interrupts
    what runs remotely instead of ending the CLI."""
    task, _ = session
    pid, fd = pty.fork()
    if pid == 0:
        _set_size(0, 30, 100)
        os.execve(
            sys.executable, [sys.executable, "-m", "autodl.cli", "shell", task.id], demo.cli_env()
        )
    try:
        # Typed once the remote prompt shows, as a person does (the CLI's switch to a raw
        # terminal discards what was typed before it). Markers are computed remotely, so the
        # terminal's echo of the input never matches them.
        _read_until(fd, "$ ")
        os.write(fd, b"stty size; echo m$((40+2))\n")
        assert "30 100" in _read_until(fd, "m42")
        _set_size(fd, 40, 120)  # the kernel tells the CLI (SIGWINCH), which tells the server
        said = ""
        for n in range(10):
            os.write(fd, f"stty size; echo r$(({n}+100))\n".encode())
            said += _read_until(fd, f"r{n + 100}")
            if "40 120" in said:
                break
            time.sleep(0.3)
        assert "40 120" in said, said
        os.write(fd, b"sleep 60; echo sl$((1+1))ept\n")
        time.sleep(0.5)
        os.write(fd, b"\x03")
        os.write(fd, b"echo m$((60+3))\n")
        said = _read_until(fd, "m63")
        assert "sl2ept" not in said, said
        os.write(fd, b"exit 3\n")
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 3
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.close(fd)


def test_port_forward_serves_a_page_and_a_websocket(demo: LiveServer, session):
    task, port = session
    local = _free_port()
    fwd = subprocess.Popen(
        [sys.executable, "-m", "autodl.cli", "port-forward", task.id, f"{local}:{port}"],
        env=demo.cli_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = fwd.stdout.readline()
        assert f"127.0.0.1:{local}" in line, (line, fwd.stderr)
        with urllib.request.urlopen(f"http://127.0.0.1:{local}/", timeout=20) as page:
            assert page.read().decode() == "hello from the task\n"
        with connect(f"ws://127.0.0.1:{local}/", open_timeout=20) as ws:
            for text in ["one", "two" * 1000]:
                ws.send(text)
                assert ws.recv(timeout=20) == text
            ws.send(b"\x00\x01binary")
            assert ws.recv(timeout=20) == b"\x00\x01binary"
    finally:
        fwd.send_signal(signal.SIGINT)
        fwd.wait(timeout=20)


def test_another_organization_reaches_nothing(demo: LiveServer, session):
    task, port = session
    with demo.raw() as http:
        http.headers.pop("Authorization")
        signup = http.post(
            "/auth/signup",
            json={
                "email": "mallory@other.example",
                "password": "Mall-ory-2024-pass!",
                "tenant_name": "Other",
            },
        )
    assert signup.status_code == 201, signup.text
    outsider = autodl.Client(api_key=signup.json()["token"], base_url=demo.url)
    with pytest.raises(autodl.NotFound):
        outsider.exec(task.id, ["id"])
    with pytest.raises(autodl.NotFound):
        outsider.tunnel(f"/tasks/{task.id}/ports/{port}")
    done = cli(demo, "exec", task.id, "--", "id", api_key=signup.json()["token"])
    assert done.returncode == 1 and "no such task" in done.stderr, done
    # The owner still gets through: nothing was broken by the refusals.
    assert demo.client().exec(task.id, ["true"]).exit_code == 0


def test_open_gives_a_link_to_the_app_on_its_own_origin(demo: LiveServer, session):
    import httpx

    task, port = session
    done = cli(demo, "open", task.id, str(port), "--print")
    assert done.returncode == 0, done
    link = httpx.URL(done.stdout.splitlines()[0])
    assert link.host == f"{port}-{task.id}.apps.localhost", link
    assert link.path == "/.autodl/enter"
    # `*.localhost` is this machine (browsers resolve it so); here the Host header says it.
    server = httpx.URL(demo.url)
    to_server = link.copy_with(host=server.host, port=server.port)
    host = {"Host": f"{link.host}:{link.port}"}
    entered = httpx.get(to_server, headers=host)
    assert entered.status_code == 303, entered.text
    assert entered.headers["location"] == "/"
    cookie = entered.headers["set-cookie"].split(";")[0]
    page = httpx.get(to_server.copy_with(path="/", query=None), headers={**host, "Cookie": cookie})
    assert page.status_code == 200 and page.text == "hello from the task\n", page.text
    # The link was good once.
    assert httpx.get(to_server, headers=host).status_code == 401


def test_ssh_and_its_port_forwarding_reach_the_session(demo: LiveServer, session, tmp_path):
    """``autodl ssh-config`` gives plain ssh (and so VS Code Remote-SSH) a way in: commands
    with their output, input and exit status, a terminal with ``-tt``, and ``-L`` to a
    declared port, all through the server."""
    import shutil

    task, port = session
    ssh = shutil.which("ssh")
    if not ssh:
        if os.environ.get("CI"):
            pytest.fail("CI has an ssh client (openssh-client); this one has none")
        pytest.skip("no ssh client on this machine")
    env = demo.cli_env()
    env["XDG_CONFIG_HOME"] = str(tmp_path / "config")
    entry = subprocess.run(
        [sys.executable, "-m", "autodl.cli", "ssh-config", f"#{task.info['number']}"]
        + ["--name", "box"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert entry.returncode == 0, entry
    assert entry.stdout.startswith("Host box\n") and "ProxyCommand" in entry.stdout, entry
    config = tmp_path / "ssh_config"
    config.write_text(entry.stdout)
    base = [ssh, "-F", str(config), "-o", "BatchMode=yes"]

    def run(*args: str, stdin: str = "") -> subprocess.CompletedProcess:
        return subprocess.run(
            base + list(args), input=stdin, env=env, capture_output=True, text=True, timeout=90
        )

    r = run("box", "echo hi $AUTODL_TASK_ID; echo oops >&2; exit 3")
    assert (r.returncode, r.stdout) == (3, f"hi {task.id}\n"), r
    assert "oops" in r.stderr, r
    # Input reaches the command; the host key is known from the first connection on.
    r = run("box", "cat", stdin="piped through ssh\n")
    assert (r.returncode, r.stdout) == (0, "piped through ssh\n"), r
    assert (tmp_path / "config" / "autodl" / "known_hosts").read_text().strip(), "host key kept"
    # On a terminal.
    r = run("-tt", "box", "[ -t 0 ] && [ -t 1 ] && echo on-a-terminal; echo TERM=$TERM")
    assert r.returncode == 0 and "on-a-terminal" in r.stdout and "TERM=xterm" in r.stdout, r
    def forwarded(remote: int, path: str) -> str:
        """The page at ``path`` of the task's port ``remote``, through ``ssh -L``."""
        local = _free_port()
        fwd = subprocess.Popen(
            base + ["-N", "-L", f"{local}:localhost:{remote}", "box"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:

            def page():
                try:
                    url = f"http://127.0.0.1:{local}{path}"
                    with urllib.request.urlopen(url, timeout=10) as p:
                        return p.read().decode()
                except OSError:
                    return None

            return _wait(page, what=f"the page of port {remote} through ssh")
        finally:
            fwd.terminate()
            fwd.wait(timeout=20)

    # A local port forwarded to the task's declared port.
    assert forwarded(port, "/") == "hello from the task\n"
    # Files copied with scp's own protocol (-O: the task runs scp, as over ssh).
    local_file = tmp_path / "weights.txt"
    local_file.write_text("copied over ssh\n")
    r = subprocess.run(
        [shutil.which("scp") or "scp", "-O", "-F", str(config), "-o", "BatchMode=yes"]
        + [str(local_file), "box:/tmp/weights.txt"],
        env=env,
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert r.returncode == 0, r
    assert run("box", "cat /tmp/weights.txt").stdout == "copied over ssh\n"
    # A login shell reads its input.
    r = run("-tt", "box", stdin="echo $((6*7)); exit 5\n")
    assert r.returncode == 5 and "42" in r.stdout, r
    # A port the task did not declare (an editor's own server, as VS Code's), started in the
    # background by one command and still serving after it: reached through a relay.
    other = _free_port()
    r = run("box", f"cd /tmp && echo relayed > page.txt && nohup python3 -m http.server {other} "
        "--bind 127.0.0.1 >/dev/null 2>&1 &")
    assert r.returncode == 0, r
    assert forwarded(other, "/page.txt") == "relayed\n"
    kinds = [e["kind"] for e in task.events()]
    assert "exec" in kinds and "port_forward" in kinds
