"""Fixtures that run the real autodl server for the live tests.

``live`` starts ``$AUTODL_SERVER_BIN serve`` once per session on a free port with a fresh
SQLite database, after creating a platform administrator with ``admin create-admin``; it then
signs up a researcher and creates an API key for them. ``cluster`` additionally registers two
nodes (4 x A100-40G in zone z1, 4 x A40 in zone z2) so tasks can be scheduled. Tests only
talk to the server through the researcher's API key, like a user would.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterator, List, Optional

import httpx
import pytest

import autodl

ADMIN_EMAIL = "ops@example.com"
ADMIN_PASSWORD = "Operat0r-secret!"
RESEARCHER_EMAIL = "ada@example.com"
RESEARCHER_PASSWORD = "Resear-cher-2024!"

NODES = [
    {
        "id": "node-a",
        "zone": "z1",
        "labels": {"rack": "r1"},
        "cpu": 64,
        "memory": "512GiB",
        "gpus": {"type": "A100-40G", "count": 4, "memory": "40GiB"},
        # The seed articles' datasets live under /data on the cluster's nodes.
        "data_roots": ["/data"],
    },
    {
        "id": "node-b",
        "zone": "z2",
        "labels": {"rack": "r2"},
        "cpu": 64,
        "memory": "512GiB",
        "gpus": {"type": "A40", "count": 4, "memory": "48GiB"},
        "data_roots": ["/data"],
    },
]

#: How long the scheduler may take to place a task on an idle cluster.
SCHEDULE_TIMEOUT = float(os.environ.get("AUTODL_TEST_SCHEDULE_TIMEOUT", "10"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """CI (``scripts/test.sh``) gives every test what it needs, so there a skip is a failure: a
    case CI can run never passes there without running."""
    outcome = yield
    report = outcome.get_result()
    if report.skipped and os.environ.get("CI"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI, which can run this case: {report.longrepr}"


@pytest.fixture(autouse=True)
def no_saved_profile(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Tests never read (or write) the profiles of whoever runs them."""
    monkeypatch.setenv("AUTODL_CONFIG", str(tmp_path / "autodl-config"))
    # Beside the test's folder, not in it: tests pack their tmp_path as a workdir.
    monkeypatch.setenv("AUTODL_CACHE_DIR", str(tmp_path.parent / f"{tmp_path.name}-cache"))
    monkeypatch.delenv("AUTODL_PROFILE", raising=False)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _task_paths(tmp: Path) -> str:
    """Host folders the demo's sandboxed tasks may read: this Python (the virtual environment
    and the installation it was made from), the SDK's sources, and a folder for the tests'
    training scripts. Nothing else of the host (the server's database in ``tmp`` included)."""
    import json

    sdk = Path(autodl.__file__).resolve().parent.parent
    paths = {sys.prefix, os.path.realpath(sys.base_prefix), str(sdk), str(tmp / "task-code")}
    return json.dumps(sorted(paths))


def _server_env(tmp: Path, port: int) -> Dict[str, str]:
    # The SDK's own variables must not leak into the server (they share the AUTODL_ prefix).
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("AUTODL_API_", "AUTODL_TASK_", "AUTODL_CONFIG"))
    }
    env.update(
        AUTODL_DATABASE_URL=f"sqlite://{tmp}/a.db",
        AUTODL_SITE_ROOT=str(tmp),
        AUTODL_LISTEN=f"127.0.0.1:{port}",
        AUTODL_STORAGE_URL=f"file://{tmp}/objects",
        # The seed articles' templates save to s3://my-bucket/checkpoints.
        AUTODL_STORAGE_BUCKETS='["my-bucket"]',
        AUTODL_DEMO_DIR=str(tmp / "demo-agents"),
        AUTODL_DEMO_TASK_PATHS=_task_paths(tmp),
        # Demo tasks' `python` is this one, with the SDK (as scripts/run.sh gives them).
        AUTODL_DEMO_PYTHON=sys.prefix,
        # A secret of the server's own: the tests check that no task can see it.
        AUTODL_JWT_SECRET="server-secret-" + uuid.uuid4().hex,
        RUST_LOG="warn",
    )
    return env


def _fail_with(message: str, log: Path) -> None:
    tail = log.read_text(errors="replace")[-4000:] if log.exists() else ""
    pytest.fail(f"{message}\n--- server output ---\n{tail}", pytrace=False)


def _check(response: httpx.Response, what: str) -> dict:
    if response.status_code >= 300:
        pytest.fail(f"{what} failed: HTTP {response.status_code} {response.text}", pytrace=False)
    return response.json() if response.content else {}


@dataclass
class LiveServer:
    """A running server and the accounts made on it."""

    url: str
    tmp: Path
    admin_token: str
    researcher_token: str
    api_key: str
    api_key_id: str
    user_id: str
    process: subprocess.Popen
    log: Path
    #: Where tests put scripts for demo tasks: readable by them (``AUTODL_DEMO_TASK_PATHS``).
    code_dir: Path
    jwt_secret: str
    clients: List[autodl.Client] = field(default_factory=list)

    def client(self, api_key: Optional[str] = None) -> autodl.Client:
        """An SDK client as the researcher (or with another key)."""
        c = autodl.Client(api_key=api_key or self.api_key, base_url=self.url, timeout=15)
        self.clients.append(c)
        return c

    def raw(self, token: Optional[str] = None) -> httpx.Client:
        """A plain HTTP client, to compare the SDK's errors with the server's own answer."""
        return httpx.Client(
            base_url=self.url + "/api/v1",
            headers={"Authorization": f"Bearer {token or self.api_key}"},
            timeout=15,
        )

    def cli_env(self, api_key: Optional[str] = None) -> Dict[str, str]:
        env = dict(os.environ)
        env.update(AUTODL_API_URL=self.url, AUTODL_API_KEY=api_key or self.api_key)
        return env


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    yield from _serve(tmp_path_factory, ["serve"])


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    """A second server started with ``serve --demo``: three simulated-GPU agents (4 x A100-40G,
    and two nodes of 2 x A40) that run tasks as local processes, so tasks really run and finish."""
    yield from _serve(tmp_path_factory, ["serve", "--demo"])


def _serve(tmp_path_factory: pytest.TempPathFactory, args: List[str]) -> Iterator[LiveServer]:
    binary = os.environ.get("AUTODL_SERVER_BIN")
    if not binary:
        pytest.skip(
            "AUTODL_SERVER_BIN is not set: live tests need the autodl-server binary "
            "(scripts/test.sh sets it)"
        )
    binary = os.path.expanduser(binary)
    if not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        pytest.fail(f"AUTODL_SERVER_BIN={binary} is not an executable file", pytrace=False)

    tmp = tmp_path_factory.mktemp("autodl-server")
    log = tmp / "server.log"
    port = _free_port()
    env = _server_env(tmp, port)
    code_dir = tmp / "task-code"
    code_dir.mkdir()

    created = subprocess.run(
        [binary, "admin", "create-admin", "--email", ADMIN_EMAIL, "--password", ADMIN_PASSWORD],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if created.returncode != 0:
        pytest.fail(
            f"admin create-admin failed ({created.returncode}):\n"
            f"{created.stdout}\n{created.stderr}",
            pytrace=False,
        )

    log_file = open(log, "wb")
    process = subprocess.Popen([binary, *args], env=env, stdout=log_file, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        if process.poll() is not None:
            log_file.close()
            _fail_with(f"the server exited with {process.returncode} before answering", log)
        try:
            if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            process.kill()
            log_file.close()
            _fail_with("the server did not answer /healthz within 60 s", log)
        time.sleep(0.1)

    server: Optional[LiveServer] = None
    try:
        with httpx.Client(base_url=url + "/api/v1", timeout=15) as http:
            admin = _check(
                http.post("/auth/login", json={"email": ADMIN_EMAIL, "password": ADMIN_PASSWORD}),
                "admin login",
            )
            signup = _check(
                http.post(
                    "/auth/signup",
                    json={
                        "email": RESEARCHER_EMAIL,
                        "password": RESEARCHER_PASSWORD,
                        "tenant_name": "Vision Lab",
                    },
                ),
                "researcher signup",
            )
            key = _check(
                http.post(
                    "/api-keys",
                    json={"name": "sdk-tests"},
                    headers={"Authorization": f"Bearer {signup['token']}"},
                ),
                "API key creation",
            )
        assert key["key"].startswith("adl_")
        server = LiveServer(
            url=url,
            tmp=tmp,
            admin_token=admin["token"],
            researcher_token=signup["token"],
            api_key=key["key"],
            api_key_id=key["info"]["id"],
            user_id=signup["user"]["id"],
            process=process,
            log=log,
            code_dir=code_dir,
            jwt_secret=env["AUTODL_JWT_SECRET"],
        )
        yield server
    finally:
        if server is not None:
            for c in server.clients:
                c.close()
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log_file.close()


@pytest.fixture(scope="session")
def cluster(live: LiveServer) -> List[dict]:
    """Registers the test nodes (as the platform administrator) and returns them as the
    researcher sees them."""
    with httpx.Client(
        base_url=live.url + "/api/v1",
        headers={"Authorization": f"Bearer {live.admin_token}"},
        timeout=15,
    ) as http:
        for node in NODES:
            _check(http.post("/admin/nodes", json=node), f"registering {node['id']}")
    return live.client().nodes()


@pytest.fixture
def client(live: LiveServer) -> autodl.Client:
    return live.client()


@pytest.fixture
def tracked(client: autodl.Client) -> Iterator[List[autodl.Task]]:
    """Tasks a test submits; those not finished are cancelled afterwards so their GPUs are
    free for the next test."""
    tasks: List[autodl.Task] = []
    yield tasks
    for task in tasks:
        try:
            if task.get_status() not in autodl.FINAL_STATUSES:
                task.cancel()
        except autodl.AutodlError:
            pass


@pytest.fixture
def suite_label() -> str:
    """A label value unique to one test, to find exactly its tasks."""
    return uuid.uuid4().hex[:12]


def wait_for_status(task: autodl.Task, wanted: str, timeout: float = SCHEDULE_TIMEOUT) -> str:
    """Polls until the task reaches ``wanted`` (or any later state); returns the last
    status seen."""
    order = ["PENDING", "SCHEDULED", "RUNNING", "COMPLETED"]
    deadline = time.monotonic() + timeout
    status = task.get_status()
    while time.monotonic() < deadline:
        if status == wanted or (status in order and order.index(status) >= order.index(wanted)):
            return status
        if status in ("FAILED", "CANCELLED"):
            return status
        time.sleep(0.2)
        status = task.get_status()
    return status


def cli(
    live: LiveServer, *args: str, api_key: Optional[str] = None, console_script: bool = False
) -> subprocess.CompletedProcess:
    """Runs the CLI in a subprocess as the researcher."""
    if console_script:
        script = shutil.which("autodl", path=os.path.dirname(sys.executable)) or shutil.which(
            "autodl"
        )
        assert script, "the autodl console script is not installed next to this Python"
        command = [script, *args]
    else:
        command = [sys.executable, "-m", "autodl.cli", *args]
    return subprocess.run(
        command, env=live.cli_env(api_key), capture_output=True, text=True, timeout=60
    )
