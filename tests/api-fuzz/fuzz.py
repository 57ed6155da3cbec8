"""Fuzzes the autodl API with Schemathesis against its own OpenAPI document: a real server
(`serve --demo`, fresh SQLite) and every check Schemathesis has, for a bounded time. Exits
non-zero on any failure.

    python tests/api-fuzz/fuzz.py [--max-time SECONDS]

Needs AUTODL_SERVER_BIN (scripts/test.sh sets it) and the packages in requirements.txt.
"""

import argparse
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

HERE = Path(__file__).resolve().parent
EMAIL = "fuzz-admin@example.com"
PASSWORD = "Fuzz-the-API-2024!"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-time", type=int, default=150)
    # One worker: Hypothesis's generation is not safe across threads (it fails inside
    # CPython's parser now and then), and the server needs the other core.
    ap.add_argument("--workers", default="1")
    args = ap.parse_args()
    binary = os.environ.get("AUTODL_SERVER_BIN")
    if not binary:
        print("AUTODL_SERVER_BIN is not set", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="autodl-fuzz-"))
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTODL_")}
    env.update(
        AUTODL_DATABASE_URL=f"sqlite://{tmp}/a.db",
        AUTODL_LISTEN=f"127.0.0.1:{port}",
        AUTODL_STORAGE_URL=f"file://{tmp}/objects",
        AUTODL_SITE_ROOT=str(tmp),
        AUTODL_DEMO_DIR=str(tmp / "demo-agents"),
        AUTODL_JWT_SECRET="fuzz-secret-" + os.urandom(8).hex(),
        # The fuzzer signs in for every key it mints.
        AUTODL_LOGIN_ATTEMPTS_PER_MINUTE_PER_ACCOUNT="100000",
        AUTODL_LOGIN_ATTEMPTS_PER_MINUTE_PER_ADDRESS="100000",
        RUST_LOG="error",
    )
    subprocess.run(
        [binary, "admin", "create-admin", "--email", EMAIL, "--password", PASSWORD],
        env=env, check=True, capture_output=True,
    )
    log = open(tmp / "server.log", "wb")
    server = subprocess.Popen([binary, "serve", "--demo"], env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(300):
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        else:
            print("the server did not start", file=sys.stderr)
            return 1
        st = shutil.which("schemathesis", path=os.path.dirname(sys.executable)) or "schemathesis"
        fuzz_env = dict(os.environ)
        fuzz_env.update(
            AUTODL_FUZZ_URL=url,
            AUTODL_FUZZ_EMAIL=EMAIL,
            AUTODL_FUZZ_PASSWORD=PASSWORD,
            SCHEMATHESIS_HOOKS="hooks",
            PYTHONPATH=str(HERE) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        )
        cmd = [
            st, "--config-file", str(HERE / "schemathesis.toml"), "run", f"{url}/api/v1/openapi.json",
            "--checks", "all",
            "--max-time", str(args.max_time),
            "--workers", args.workers,
            # Agents' long polls are held up to 30 s.
            "--request-timeout", "40",
            "--no-color",
            "--seed", os.environ.get("AUTODL_FUZZ_SEED", "20261201"),
        ]
        print("$", " ".join(cmd), flush=True)
        return subprocess.run(cmd, env=fuzz_env, cwd=tmp).returncode
    finally:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
        log.close()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
