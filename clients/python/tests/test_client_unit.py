"""The SDK against a scripted transport (httpx.MockTransport): request shapes and error
mapping. Behaviour against the real server is covered by test_live.py."""

import io
import json
import tarfile

import httpx
import pytest

import autodl
from autodl.errors import error_class


def error(status, code, message, field=None, headers=None):
    return httpx.Response(
        status, json={"error": {"code": code, "message": message, "field": field}}, headers=headers
    )


def client_for(handler, **kw):
    return autodl.Client(
        api_key="adl_test", base_url="http://srv:9", transport=httpx.MockTransport(handler), **kw
    )


TASK = {
    "id": "t1",
    "name": "mnist",
    "state": "pending",
    "spec": {"labels": {}},
    "placement": None,
    "waiting": None,
}


@pytest.mark.parametrize(
    "status,code,cls",
    [
        (400, "validation", autodl.ValidationError),
        (400, "unschedulable", autodl.Unschedulable),
        (401, "unauthorized", autodl.AuthenticationError),
        (403, "forbidden", autodl.PermissionDenied),
        (403, "quota", autodl.QuotaExceeded),
        (404, "not_found", autodl.NotFound),
        (404, "no_results", autodl.NotFound),
        (409, "conflict", autodl.Conflict),
        (429, "rate_limited", autodl.RateLimited),
        (500, "internal", autodl.ServerError),
        (418, "teapot", autodl.AutodlError),
    ],
)
def test_errors_map_to_exceptions_with_the_server_message(status, code, cls):
    c = client_for(
        lambda req: error(status, code, f"server says {code}", "priority", {"Retry-After": "7"})
    )
    with pytest.raises(cls) as exc:
        c.get_task("t1")
    e = exc.value
    assert type(e) is cls
    assert (e.status, e.code, e.message, e.field) == (
        status,
        code,
        f"server says {code}",
        "priority",
    )
    assert f"server says {code}" in str(e)
    if cls is autodl.RateLimited:
        assert e.retry_after == 7.0


def test_subclass_relations():
    assert issubclass(autodl.Unschedulable, autodl.ValidationError)
    assert issubclass(autodl.QuotaExceeded, autodl.PermissionDenied)
    assert issubclass(autodl.ValidationError, ValueError)
    assert issubclass(autodl.AutodlConnectionError, autodl.AutodlError)
    # a code never widens the class chosen by status
    assert error_class(404, "unschedulable") is autodl.NotFound


def test_non_json_error_body():
    c = client_for(lambda req: httpx.Response(502, text="<html>bad gateway</html>"))
    with pytest.raises(autodl.ServerError) as exc:
        c.nodes()
    assert exc.value.code is None and "bad gateway" in exc.value.message


def test_network_errors_become_connection_errors():
    def boom(req):
        raise httpx.ConnectError("connection refused", request=req)

    with pytest.raises(autodl.AutodlConnectionError, match="http://srv:9"):
        client_for(boom).nodes()


def test_submit_task_sends_mapped_spec_auth_and_idempotency_key():
    seen = []

    def handler(req):
        seen.append(req)
        return httpx.Response(201, json={**TASK, "name": "distributed_mnist"})

    c = client_for(handler)
    task = c.submit_task(
        {
            "task_name": "distributed_mnist",
            "image": "i",
            "entry_point": "train.py",
            "checkpoint_path": "/c",
        },
        request=autodl.TaskRequest(priority=0.8),
        idempotency_key="k-1",
    )
    (req,) = seen
    assert req.method == "POST" and req.url.path == "/api/v1/tasks"
    assert req.headers["authorization"] == "Bearer adl_test"
    assert req.headers["idempotency-key"] == "k-1"
    assert json.loads(req.content) == {
        "name": "distributed_mnist",
        "image": "i",
        "entry_point": "train.py",
        "checkpoint": {"save_to": "/c"},
        "priority": 0.8,
    }
    assert task.id == "t1" and task.status == "PENDING"


def test_refusals_name_the_keys_the_user_wrote():
    def handler(req):
        body = json.loads(req.content)
        if "gpu_cout" in body:
            return error(400, "validation", "gpu_cout is not a field of this request", "gpu_cout")
        return error(
            400, "validation", "resources.gpu.count must be at least 0", "resources.gpu.count"
        )

    c = client_for(handler)
    with pytest.raises(autodl.ValidationError) as refused:
        c.submit_task({"task_name": "t", "image": "i", "gpu_count": -1})
    assert refused.value.field == "gpu_count"
    assert refused.value.message.startswith("gpu_count (sent as resources.gpu.count): ")
    with pytest.raises(autodl.ValidationError) as unknown:
        c.submit_task({"task_name": "t", "image": "i", "gpu_cout": 2})
    assert unknown.value.field == "gpu_cout"
    assert unknown.value.message.endswith("did you mean 'gpu_count'?")
    # A native spec keeps the server's words.
    with pytest.raises(autodl.ValidationError) as native:
        c.submit_task({"name": "t", "image": "i", "resources": {"gpu": {"count": -1}}})
    assert native.value.field == "resources.gpu.count"


def test_env_configuration(monkeypatch):
    monkeypatch.setenv("AUTODL_API_URL", "http://from-env:1/")
    monkeypatch.setenv("AUTODL_API_KEY", "adl_env")
    c = autodl.Client()
    assert c.base_url == "http://from-env:1" and c.api_key == "adl_env"
    monkeypatch.delenv("AUTODL_API_URL")
    assert autodl.Client().base_url == "http://127.0.0.1:8080"


def test_the_api_address_is_taken_as_the_server_address():
    seen = []

    def handler(request):
        seen.append(str(request.url))
        return httpx.Response(200, json={"items": [], "next_cursor": None})

    for url in ["http://srv:9/api/v1", "http://srv:9/api/v1/", " http://srv:9/ "]:
        c = autodl.Client(api_key="adl_test", base_url=url, transport=httpx.MockTransport(handler))
        assert c.base_url == "http://srv:9"
        list(c.list_tasks())
    assert all(u.startswith("http://srv:9/api/v1/tasks") for u in seen), seen


def test_list_tasks_follows_cursors_and_filters():
    calls = []

    def handler(req):
        calls.append(dict(req.url.params.multi_items()))
        if "cursor" not in req.url.params:
            items = [
                {**TASK, "id": "a", "spec": {"labels": {"team": "v", "run": "1"}}},
                {**TASK, "id": "b", "spec": {"labels": {"team": "v", "run": "2"}}},
            ]
            return httpx.Response(200, json={"items": items, "next_cursor": "c1"})
        return httpx.Response(
            200,
            json={
                "items": [{**TASK, "id": "c", "spec": {"labels": {"team": "v", "run": "1"}}}],
                "next_cursor": None,
            },
        )

    c = client_for(handler)
    ids = [t.id for t in c.list_tasks(state="RUNNING", label={"team": "v", "run": "1"}, user="me")]
    assert ids == ["a", "c"]
    assert calls[0] == {"limit": "50", "state": "running", "user": "me", "label": "team=v"}
    assert calls[1]["cursor"] == "c1"
    assert [t.id for t in c.list_tasks(limit=1)] == ["a"]


def test_status_wait_and_timeout(monkeypatch):
    states = iter(["pending", "scheduled", "running", "completed"])
    c = client_for(lambda req: httpx.Response(200, json={**TASK, "state": next(states)}))
    task = c.task("t1")
    assert task.get_status() == "PENDING"
    assert task.wait(poll=0) == "COMPLETED"

    stuck = client_for(lambda req: httpx.Response(200, json=TASK)).task("t1")
    with pytest.raises(autodl.TaskTimeout) as exc:
        stuck.wait(timeout=0.05, poll=0.01)
    assert isinstance(exc.value, TimeoutError) and "PENDING" in str(exc.value)


def test_wait_waits_for_results_still_uploading():
    # Completed while its results were uploading from its node: wait() waits for them.
    states = iter(["uploading", "uploading", None])
    c = client_for(
        lambda req: httpx.Response(200, json={**TASK, "state": "completed", "results": next(states)})
    )
    task = c.task("t1").refresh()
    assert task.results_state == "uploading"
    assert task.wait(poll=0) == "COMPLETED"
    assert task.results_state is None

    stuck = client_for(
        lambda req: httpx.Response(200, json={**TASK, "state": "completed", "results": "uploading"})
    ).task("t1")
    assert stuck.wait(poll=0, results=False) == "COMPLETED"
    with pytest.raises(autodl.TaskTimeout) as exc:
        stuck.wait(timeout=0.05, poll=0.01)
    assert "results uploading" in str(exc.value)


def test_logs_pages_and_follow():
    def handler(req):
        if req.url.path.endswith("/logs"):
            after = int(req.url.params["after"])
            if after == 0:
                return httpx.Response(
                    200,
                    json={
                        "lines": [{"seq": 1, "line": "a"}, {"seq": 2, "line": "b"}],
                        "next_after": 2,
                    },
                )
            if after == 2:
                return httpx.Response(
                    200, json={"lines": [{"seq": 3, "line": "c"}], "next_after": 3}
                )
            return httpx.Response(200, json={"lines": [], "next_after": after})
        assert (
            req.url.path.endswith("/logs/stream") and req.headers["accept"] == "text/event-stream"
        )
        body = (
            ": keep-alive\n\n"
            'data: {"seq": 1, "line": "epoch 1"}\n\n'
            'data: {"seq": 2, "stream": "stderr",\ndata:  "line": "warn"}\n\n'
            "event: end\ndata: {}\n\n"
            'data: {"seq": 9, "line": "never"}\n\n'
        )
        return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})

    task = client_for(handler).task("t1")
    assert task.logs() == ["a", "b", "c"]
    follow = task.logs(follow=True)
    assert not isinstance(follow, list)
    assert list(follow) == ["epoch 1", "warn"]


def test_logs_of_one_worker():
    lines = [
        {"seq": 1, "line": "r0 a", "rank": 0},
        {"seq": 2, "line": "r1 a", "rank": 1},
        {"seq": 3, "line": "r1 b", "rank": 1},
    ]

    def handler(req):
        after = int(req.url.params["after"])
        rest = [line for line in lines if line["seq"] > after]
        return httpx.Response(200, json={"lines": rest, "next_after": 3})

    task = client_for(handler).task("t1")
    assert task.logs(rank=1) == ["r1 a", "r1 b"]
    assert task.logs(rank=0, markers=True) == ["[rank 0] r0 a"]


def _tar_bytes(files):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_download_results(tmp_path):
    payload = _tar_bytes({"model.pt": b"weights", "logs/train.csv": b"1,2"})
    c = client_for(
        lambda req: httpx.Response(
            200, content=payload, headers={"content-type": "application/gzip"}
        )
    )
    out = c.task("t1").download_results(tmp_path / "output")
    assert out == tmp_path / "output"
    assert (out / "model.pt").read_bytes() == b"weights" and (out / "logs" / "train.csv").exists()

    evil = _tar_bytes({"../escape.txt": b"x"})
    c = client_for(lambda req: httpx.Response(200, content=evil))
    with pytest.raises(autodl.UnsafeArchive):
        c.task("t1").download_results(tmp_path / "o2")
    assert not (tmp_path / "escape.txt").exists()

    c = client_for(
        lambda req: error(404, "no_results", "task t1 has no results yet (state: pending)")
    )
    with pytest.raises(autodl.NotFound, match="has no results yet"):
        c.task("t1").download_results(tmp_path / "o3")


def test_monitor_merges_latest_samples_in_readable_units():
    pages = [
        {
            "samples": [
                {
                    "at": "2024-01-01T00:00:01Z",
                    "gpu_util": 0.5,
                    "mem_used": 10 * 2**30,
                    "mem_total": 40 * 2**30,
                    "epoch": None,
                    "loss": None,
                    "values": {},
                },
                {
                    "at": "2024-01-01T00:00:02Z",
                    "gpu_util": None,
                    "mem_used": None,
                    "mem_total": None,
                    "epoch": 2.0,
                    "loss": 0.4,
                    "values": {"accuracy": 0.8},
                },
            ]
        },
        {
            "samples": [
                {
                    "at": "2024-01-01T00:00:03Z",
                    "gpu_util": 0.93,
                    "mem_used": 20 * 2**30,
                    "mem_total": 80 * 2**30,
                    # Two GPUs: the mean and the sums above, each GPU's own values here.
                    "values": {
                        "gpu0_util": 0.96,
                        "gpu0_mem": 12 * 2**30,
                        "gpu1_util": 0.9,
                        "gpu1_mem": 8 * 2**30,
                    },
                },
            ]
        },
    ]
    afters = []

    def handler(req):
        if req.url.path.endswith("/metrics"):
            afters.append(req.url.params.get("after"))
            return httpx.Response(200, json=pages[len(afters) - 1])
        return httpx.Response(200, json={**TASK, "state": "running"})

    c = client_for(handler)
    monitor = autodl.get_monitor("t1", client=c)
    assert monitor.status == "RUNNING"
    m = monitor.get_metrics()
    assert m["gpu_util"] == 50.0 and m.mem_used == 10240.0 and m.mem_total == 40960.0
    assert m.epoch == 2 and isinstance(m.epoch, int) and m.loss == 0.4 and m["accuracy"] == 0.8
    m = monitor.get_metrics()
    assert afters == [None, "2024-01-01T00:00:02Z"]
    assert m.gpu_util == 93.0 and m.gpu_util_fraction == 0.93 and m.mem_used_bytes == 20 * 2**30
    assert m.epoch == 2  # kept from the earlier report
    assert m.mem_total == 81920.0  # summed over the task's GPUs
    assert [(g["index"], g["gpu_util"], g["mem_used"]) for g in m.gpus] == [
        (0, 96.0, 12288.0),
        (1, 90.0, 8192.0),
    ]
    assert "gpu0_util" not in m
    assert autodl.Metrics().epoch is None
    with pytest.raises(AttributeError):
        m.nonexistent  # noqa: B018


def test_cancel_and_history_calls():
    def handler(req):
        path = req.url.path
        if path.endswith("/cancel"):
            assert req.method == "POST"
            return httpx.Response(200, json={**TASK, "state": "cancelled"})
        if path.endswith("/events"):
            return httpx.Response(200, json=[{"at": "x", "kind": "submitted", "message": "m"}])
        if path.endswith("/attempts"):
            return httpx.Response(200, json=[])
        if path.endswith("/nodes"):
            return httpx.Response(200, json=[{"id": "node-a", "gpus": []}])
        raise AssertionError(path)

    c = client_for(handler)
    task = c.task("t1")
    assert task.cancel() == "CANCELLED" and task.finished
    assert task.events()[0]["kind"] == "submitted"
    assert task.attempts() == []
    assert c.nodes()[0]["id"] == "node-a"


def test_log_markers_show_retries_and_ranks():
    from autodl.task import _marked

    records = [
        {"seq": 1, "attempt": 1, "line": "start"},
        {"seq": 2, "attempt": 1, "line": "oom"},
        {"seq": 3, "attempt": 2, "rank": 0, "line": "again"},
        {"seq": 4, "attempt": 2, "rank": 1, "line": "worker two"},
    ]
    assert list(_marked(records, True)) == [
        "start",
        "oom",
        "── attempt 2 ──",
        "[rank 0] again",
        "[rank 1] worker two",
    ]
    assert list(_marked(records, False)) == ["start", "oom", "again", "worker two"]


def test_event_streams_are_read_as_the_sse_specification_says():
    body = (
        ": a comment keeps the connection open\r\n\r\n"
        "retry: 10000\n\n"
        'event: line\ndata: {"seq": 1,\ndata: "line": "a"}\n\n'
        'data:{"seq":2,"line":"b"}\r\n\r\n'
        'id: 3\rdata: {"seq": 3, "line": "c"}\r\r'
        "data: not json\n\n"
        "event: end\ndata: {}\n\n"
        'data: {"seq": 4, "line": "never finished"}'
    )

    def handler(req):
        assert req.headers["accept"] == "text/event-stream"
        return httpx.Response(200, headers={"content-type": "text/event-stream"}, content=body)

    c = client_for(handler)
    events = list(c._http.sse("/api/v1/tasks/t1/logs/stream"))
    assert events == [
        ("line", {"seq": 1, "line": "a"}),
        ("message", {"seq": 2, "line": "b"}),
        ("message", {"seq": 3, "line": "c"}),
        ("end", {}),
    ]


def test_a_page_instead_of_an_event_stream_is_a_connection_error():
    c = client_for(lambda req: httpx.Response(200, headers={"content-type": "text/html"}, text="<p>"))
    with pytest.raises(autodl.AutodlConnectionError):
        list(c._http.sse("/api/v1/tasks/t1/logs/stream"))
