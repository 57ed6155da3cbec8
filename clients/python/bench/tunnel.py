"""Tunnels through the server, timed against a real server (``serve --demo``, the debug build
that ``scripts/run.sh`` serves): a session runs a TCP echo server on a declared port, and the
same exchanges go to it directly and through ``/api/v1/tasks/{id}/ports/{port}`` (person ->
server -> agent -> port and back). Reports the time to open a tunnel, the round trip of a
small message (median and p99; the difference is what the tunnel adds), the throughput of
an echoed stream, and the round trip of ``autodl exec`` (``true`` run in the session).

    scripts/bench-tunnel.sh              # builds the server, then runs this
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from demo import demo_server, free_port

import autodl

ECHO = """
import asyncio, sys

async def handle(reader, writer):
    while True:
        data = await reader.read(65536)
        if not data:
            break
        writer.write(data)
        await writer.drain()
    writer.close()

async def main():
    server = await asyncio.start_server(handle, "127.0.0.1", int(sys.argv[1]))
    print("listening", flush=True)
    async with server:
        await server.serve_forever()

asyncio.run(main())
"""


def pct(values: list, q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def direct_round_trips(port: int, n: int, size: int) -> list:
    out = []
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        msg = b"x" * size
        for _ in range(n):
            t = time.perf_counter()
            s.sendall(msg)
            got = 0
            while got < size:
                got += len(s.recv(65536))
            out.append(time.perf_counter() - t)
    return out


def tunnel_round_trips(ws, n: int, size: int) -> list:
    out = []
    msg = b"x" * size
    for _ in range(n):
        t = time.perf_counter()
        ws.send(msg)
        got = 0
        while got < size:
            got += len(ws.recv(timeout=30))
        out.append(time.perf_counter() - t)
    return out


def direct_throughput(port: int, total: int) -> float:
    with socket.create_connection(("127.0.0.1", port)) as s:
        chunk = b"y" * 32768

        def send() -> None:
            for _ in range(total // len(chunk)):
                s.sendall(chunk)

        t = time.perf_counter()
        sender = threading.Thread(target=send)
        sender.start()
        got = 0
        while got < total:
            got += len(s.recv(1 << 20))
        sender.join()
        return total / (time.perf_counter() - t)


def tunnel_throughput(ws, total: int) -> float:
    chunk = b"y" * 32768

    def send() -> None:
        for _ in range(total // len(chunk)):
            ws.send(chunk)

    t = time.perf_counter()
    sender = threading.Thread(target=send)
    sender.start()
    got = 0
    while got < total:
        got += len(ws.recv(timeout=60))
    sender.join()
    return total / (time.perf_counter() - t)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default=os.environ.get("AUTODL_SERVER_BIN"))
    ap.add_argument("--round-trips", type=int, default=2000)
    ap.add_argument("--megabytes", type=int, default=64)
    ap.add_argument("--opens", type=int, default=20)
    ap.add_argument("--execs", type=int, default=20)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="autodl-bench-"))
    code = tmp / "task-code"
    code.mkdir()
    (code / "echo.py").write_text(ECHO)
    with demo_server(args.server, tmp, (str(code),)) as (url, token):
        client = autodl.Client(api_key=token, base_url=url, timeout=120)
        echo_port = free_port()
        task = client.submit_spec(
            {
                "name": "echo",
                "image": "none",
                "kind": "session",
                "ports": [echo_port],
                "command": ["python", str(code / "echo.py"), str(echo_port)],
                "resources": {"gpu": {"count": 1}},
            }
        )
        deadline = time.monotonic() + 120
        while "listening" not in "".join(task.logs()):
            assert time.monotonic() < deadline, "the echo server did not start"
            time.sleep(0.2)
        path = f"/tasks/{task.id}/ports/{echo_port}"

        opens = []
        for _ in range(args.opens):
            t = time.perf_counter()
            ws = client.tunnel(path)
            ws.send(b"ping")
            ws.recv(timeout=30)
            opens.append(time.perf_counter() - t)
            ws.close()
        execs = []
        for _ in range(args.execs):
            t = time.perf_counter()
            result = task.exec(["true"])
            execs.append(time.perf_counter() - t)
            assert result.exit_code == 0, result
        total = args.megabytes * 1024 * 1024
        try:
            direct = direct_round_trips(echo_port, args.round_trips, 64)
            direct_bps = direct_throughput(echo_port, total)
        except ConnectionRefusedError:
            # Run as root, a task has a network namespace of its own: only the tunnel reaches it.
            direct, direct_bps = [float("nan")], float("nan")
        ws = client.tunnel(path)
        tunneled = tunnel_round_trips(ws, args.round_trips, 64)
        tunnel_bps = tunnel_throughput(ws, total)
        ws.close()
        ms = 1000.0
        print(
            f"tunnel open + first echo: median {statistics.median(opens) * ms:.1f} ms "
            f"(p99 {pct(opens, 0.99) * ms:.1f} ms, {args.opens} opens)"
        )
        print(
            f"64-byte round trip: direct median {statistics.median(direct) * ms:.3f} ms "
            f"(p99 {pct(direct, 0.99) * ms:.3f}); through the tunnel median "
            f"{statistics.median(tunneled) * ms:.3f} ms (p99 {pct(tunneled, 0.99) * ms:.3f}); "
            f"added {(statistics.median(tunneled) - statistics.median(direct)) * ms:.3f} ms "
            f"({args.round_trips} round trips)"
        )
        print(
            f"echoed stream of {args.megabytes} MiB: direct {direct_bps / 1e6:.0f} MB/s, "
            f"through the tunnel {tunnel_bps / 1e6:.0f} MB/s"
        )
        print(
            f"exec of `true` (open, run, exit code back): median "
            f"{statistics.median(execs) * ms:.1f} ms (max {max(execs) * ms:.1f} ms, "
            f"{args.execs} execs)"
        )
        task.cancel()
    return 0


if __name__ == "__main__":
    sys.exit(main())
