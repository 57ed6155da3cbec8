"""How long placement stops when the scheduler's leader fails, timed against real servers: two
``autodl-server`` processes on one PostgreSQL database and a real agent (simulated GPU, tasks
as local processes). Each run fails whichever server leads, by SIGSTOP (frozen: PostgreSQL still
sees its lock connection, so only the lease tells) or SIGKILL (dead), submits a task through
the other server, and times from the failure to the task's placement (it leaves ``pending``).
A frozen leader is woken (SIGCONT) and a killed one started again before the next run.

    scripts/bench-failover.sh [--runs N] [--fault stop|kill]   # builds, starts PostgreSQL
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import httpx

from demo import free_port

EMAIL, PASSWORD = "ops@example.com", "Operat0r-failover!"


class Server:
    def __init__(self, binary: str, env: dict) -> None:
        self.binary, self.port = binary, free_port()
        self.env = {**env, "AUTODL_LISTEN": f"127.0.0.1:{self.port}"}
        self.url = f"http://127.0.0.1:{self.port}"
        self.proc: Optional[subprocess.Popen] = None
        self.start()

    def start(self) -> None:
        self.proc = subprocess.Popen([self.binary, "serve"], env=self.env)
        wait_for(lambda: self.health() is not None, 60, f"{self.url} never answered")

    def health(self) -> Optional[dict]:
        try:
            return httpx.get(f"{self.url}/healthz", timeout=0.5).json()
        except (httpx.TransportError, ValueError):
            return None

    def role(self) -> Optional[str]:
        h = self.health()
        return h and h.get("role")


def wait_for(cond, seconds: float, what: str) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > deadline:
            raise SystemExit(what)
        time.sleep(0.05)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default=os.environ.get("AUTODL_SERVER_BIN"))
    ap.add_argument("--agent", default=os.environ.get("AUTODL_AGENT_BIN"))
    ap.add_argument("--database", default=os.environ.get("AUTODL_BENCH_PG_URL"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--fault", choices=["stop", "kill"], default="stop")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="autodl-failover-"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("AUTODL_")}
    env.update(
        AUTODL_DATABASE_URL=args.database,
        AUTODL_STORAGE_URL=f"file://{tmp}/objects",
        AUTODL_SITE_ROOT=str(tmp),
        AUTODL_JWT_SECRET="failover-bench-secret",
        RUST_LOG="off",
    )
    made = subprocess.run(
        [args.server, "admin", "create-admin", "--email", EMAIL, "--password", PASSWORD],
        env=env,
        capture_output=True,
    )
    if made.returncode != 0:
        print(made.stderr.decode(), file=sys.stderr)
        return 1
    servers = [Server(args.server, env), Server(args.server, env)]
    agent = None
    try:
        wait_for(lambda: sum(s.role() == "leader" for s in servers) == 1, 30, "no leader")
        base = servers[0].url
        op = httpx.post(f"{base}/api/v1/auth/login", json={"email": EMAIL, "password": PASSWORD})
        op.raise_for_status()
        auth = {"Authorization": f"Bearer {op.json()['token']}"}
        reg = httpx.post(
            f"{base}/api/v1/admin/registration-tokens", json={"node_id": "bench-1"}, headers=auth
        )
        reg.raise_for_status()
        agent = subprocess.Popen(
            [args.agent, "--server", base, "--node-id", "bench-1", "--token", reg.json()["token"],
             "--simulate", "1xA100-40G", "--runtime", "process", "--isolation", "off",
             "--metrics-listen", "off", "--state-dir", str(tmp / "agent")],
            env={**env, "RUST_LOG": "off"},
        )
        wait_for(
            lambda: "bench-1" in httpx.get(f"{base}/api/v1/nodes", headers=auth).text, 30,
            "the agent never joined",
        )
        httpx.post(f"{base}/api/v1/admin/nodes/bench-1/open-to-all", headers=auth).raise_for_status()
        seconds: List[float] = []
        for run in range(args.runs):
            wait_for(lambda: sum(s.role() == "leader" for s in servers) == 1, 30, "no leader")
            leader = next(s for s in servers if s.role() == "leader")
            other = next(s for s in servers if s is not leader)
            failed = time.monotonic()
            if args.fault == "stop":
                leader.proc.send_signal(signal.SIGSTOP)
            else:
                leader.proc.kill()
                leader.proc.wait()
            task = httpx.post(
                f"{other.url}/api/v1/tasks",
                json={"name": f"after-{args.fault}-{run}", "image": "none", "command": "true",
                      "resources": {"gpu": {"type": "A100", "count": 1}}},
                headers=auth,
            )
            task.raise_for_status()
            tid = task.json()["id"]

            def placed() -> bool:
                t = httpx.get(f"{other.url}/api/v1/tasks/{tid}", headers=auth).json()
                return t["state"] != "pending"

            wait_for(placed, 60, f"run {run}: never placed")
            seconds.append(time.monotonic() - failed)
            what = "frozen" if args.fault == "stop" else "killed"
            print(f"run {run}: leader {what}, task placed by the next {seconds[-1]:.2f} s later")
            if args.fault == "stop":
                leader.proc.send_signal(signal.SIGCONT)
                wait_for(lambda: leader.role() == "follower", 30, "the woken leader still leads")
            else:
                leader.start()
            wait_for(
                lambda: httpx.get(f"{other.url}/api/v1/tasks/{tid}", headers=auth).json()["state"]
                == "completed",
                60,
                "the task never completed",
            )
        print(
            f"leader {args.fault} to next placement over {len(seconds)} runs: "
            f"median {statistics.median(seconds):.2f} s, min {min(seconds):.2f} s, max {max(seconds):.2f} s"
        )
    finally:
        if agent:
            agent.terminate()
            agent.wait(timeout=30)
        for s in servers:
            if s.proc and s.proc.poll() is None:
                s.proc.send_signal(signal.SIGCONT)
                s.proc.terminate()
                s.proc.wait(timeout=30)
    return 0


if __name__ == "__main__":
    sys.exit(main())
