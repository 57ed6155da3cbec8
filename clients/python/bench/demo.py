"""The server the benchmarks time: ``serve --demo`` (two simulated-GPU agents running tasks as
local processes) on a fresh SQLite database, and a researcher signed up on it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator, Tuple

import httpx

import autodl


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def demo_server(
    binary: str, tmp: Path, task_paths: Tuple[str, ...] = ()
) -> Iterator[Tuple[str, str]]:
    """Runs the server until the block ends; yields its address and a researcher's token.
    ``task_paths`` are host folders sandboxed demo tasks may read (scripts they run); this
    Python, with the SDK, is the tasks' ``python``."""
    sdk = Path(autodl.__file__).resolve().parent.parent
    readable = sorted({sys.prefix, os.path.realpath(sys.base_prefix), str(sdk), *task_paths})
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTODL_")}
    env.update(
        AUTODL_DATABASE_URL=f"sqlite://{tmp}/a.db",
        AUTODL_LISTEN=f"127.0.0.1:{port}",
        AUTODL_STORAGE_URL=f"file://{tmp}/objects",
        AUTODL_DEMO_DIR=str(tmp / "demo"),
        AUTODL_DEMO_TASK_PATHS=json.dumps(readable),
        AUTODL_DEMO_PYTHON=sys.prefix,
        AUTODL_SITE_ROOT=str(tmp),
        RUST_LOG="off",
    )
    server = subprocess.Popen([binary, "serve", "--demo"], env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        r = httpx.post(
            f"{url}/api/v1/auth/signup",
            json={"email": "bench@example.com", "password": "Bench-marks-2026", "tenant_name": "B"},
        )
        r.raise_for_status()
        token = r.json()["token"]
        # The demo's nodes registered.
        client = autodl.Client(api_key=token, base_url=url)
        for _ in range(100):
            if len(client.nodes()) >= 2:
                break
            time.sleep(0.1)
        yield url, token
    finally:
        server.terminate()
        server.wait(timeout=30)
