"""Schemathesis hooks for the autodl API fuzz run (loaded through SCHEMATHESIS_HOOKS).

The fuzzer may revoke the very API key it uses (it learns key ids from `GET /api-keys`), so
every second the key is checked and, once revoked, replaced by a freshly minted one, made
through a platform administrator's session. A revoked key then costs at most a second of
401 answers, which the document lists.
"""

import os
import uuid

import httpx
import schemathesis

BASE = os.environ["AUTODL_FUZZ_URL"]
EMAIL = os.environ["AUTODL_FUZZ_EMAIL"]
PASSWORD = os.environ["AUTODL_FUZZ_PASSWORD"]

_session = {"token": None, "key": None, "node": None}
NODE_ID = "fuzz-node"


def _login() -> str:
    r = httpx.post(f"{BASE}/api/v1/auth/login", json={"email": EMAIL, "password": PASSWORD}, timeout=30)
    if r.status_code != 200:
        with open(os.environ.get("AUTODL_FUZZ_LOG", os.devnull), "a") as f:
            print(f"login failed: {r.status_code} {r.text}", file=f)
    r.raise_for_status()
    return r.json()["token"]


def _mint() -> str:
    for _ in range(3):
        if _session["token"] is None:
            _session["token"] = _login()
        r = httpx.post(
            f"{BASE}/api/v1/api-keys",
            json={"name": "fuzz"},
            headers={"Authorization": f"Bearer {_session['token']}"},
            timeout=30,
        )
        if r.status_code == 201:
            return r.json()["key"]
        _session["token"] = None
    msg = f"could not mint an API key: {r.status_code} {r.text}"
    with open(os.environ.get("AUTODL_FUZZ_LOG", os.devnull), "a") as f:
        print(msg, file=f)
    raise RuntimeError(msg)


def _current() -> str:
    """The key in use while it still works, else a new one."""
    key = _session["key"]
    if key is not None:
        r = httpx.get(f"{BASE}/api/v1/me", headers={"Authorization": f"Bearer {key}"}, timeout=30)
        if r.status_code == 200:
            return key
    _session["key"] = _mint()
    return _session["key"]


def _admin(method: str, path: str, **kw) -> httpx.Response:
    if _session["token"] is None:
        _session["token"] = _login()
    return httpx.request(
        method, f"{BASE}/api/v1{path}",
        headers={"Authorization": f"Bearer {_session['token']}"}, timeout=30, **kw,
    )


def _node() -> str:
    """A node credential for the agent API, registered again when the fuzzer removed it."""
    cred = _session["node"]
    if cred is not None:
        r = httpx.post(f"{BASE}/api/v1/agent/poll", json={}, headers={"Authorization": f"Bearer {cred}"}, timeout=30)
        if r.status_code == 200:
            return cred
    # A token for this node may replace the credential of the node if it still exists.
    t = _admin("POST", "/admin/registration-tokens", json={"node_id": NODE_ID})
    if t.status_code != 201:
        _session["token"] = None
        t = _admin("POST", "/admin/registration-tokens", json={"node_id": NODE_ID})
    t.raise_for_status()
    node = {"id": NODE_ID, "cpu": 8, "memory": 1 << 34,
            "gpus": [{"index": 0, "type": "A100-40G", "memory": 42949672960}],
            "host": {"runtime": "docker", "isolation": "container"}}
    r = httpx.post(f"{BASE}/api/v1/agent/register", json={"token": t.json()["token"], "node": node}, timeout=30)
    r.raise_for_status()
    _session["node"] = r.json()["credential"]
    return _session["node"]


@schemathesis.auth(refresh_interval=1)
class MintedKey:
    """A user's key for the user API, the fuzz node's credential for the agent API."""

    def get(self, case, ctx):
        return {"key": _current(), "node": _node()}

    def set(self, case, data, ctx):
        case.headers = case.headers or {}
        agent_api = case.operation.path.startswith("/api/v1/agent/")
        case.headers["Authorization"] = f"Bearer {data['node'] if agent_api else data['key']}"
        # A key reused with another body is refused (422) by design, which the stateful phase
        # does not expect of every operation; each generated request gets a key of its own.
        for name in list(case.headers):
            if name.lower() == "idempotency-key":
                case.headers[name] = str(uuid.uuid4())
