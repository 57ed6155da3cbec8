"""The SDK and CLI against the real server (see conftest.py): no mocks.

Every call goes through the researcher's API key. Tasks are never run (no node agent in
these tests), so they go from PENDING to SCHEDULED and are cancelled afterwards.
"""

from __future__ import annotations

import datetime as dt
import json
import threading
import uuid

import pytest
from conftest import SCHEDULE_TIMEOUT, LiveServer, cli, wait_for_status

import autodl
from autodl import TaskTemplate
from autodl.scheduler import TaskRequest

pytestmark = pytest.mark.live

SEED_CONFIG = {
    "task_name": "distributed_mnist",
    "num_workers": 4,
    "gpu_per_worker": 1,
    "image": "pytorch/pytorch:latest",
    "entry_point": "train.py",
    "data_path": "/data/mnist",
    "checkpoint_path": "/checkpoints",
}


def small_config(name: str, **extra) -> dict:
    return {
        "task_name": name,
        "image": "pytorch/pytorch:latest",
        "entry_point": "train.py",
        "gpu_per_worker": 1,
        **extra,
    }


def nodes_with(cluster, gpu_prefix: str) -> set:
    return {n["id"] for n in cluster if any(g["type"].startswith(gpu_prefix) for g in n["gpus"])}


def server_error(live: LiveServer, method: str, path: str, **kw) -> dict:
    """The server's own error answer for a request, to compare with the SDK's exception."""
    with live.raw() as http:
        response = http.request(method, path, **kw)
    assert response.status_code >= 400, response.text
    return response.json()["error"]


# Accounts and cluster ----------------------------------------------------------------------


def test_me_and_nodes(live, cluster, client):
    me = client.me()
    assert me["email"] == "ada@example.com" and me["id"] == live.user_id
    nodes = {n["id"]: n for n in client.nodes()}
    assert set(nodes) >= {"node-a", "node-b"}
    assert [g["type"] for g in nodes["node-a"]["gpus"]] == ["A100-40G"] * 4
    assert [g["type"] for g in nodes["node-b"]["gpus"]] == ["A40"] * 4
    assert nodes["node-a"]["zone"] == "z1" and nodes["node-b"]["zone"] == "z2"


def test_revoked_key_raises_authentication_error(live):
    login = autodl.Client.login("ada@example.com", "Resear-cher-2024!", base_url=live.url)
    created = login.create_api_key("short-lived")
    key = created["key"]
    assert key.startswith("adl_")
    temp = live.client(api_key=key)
    assert temp.me()["email"] == "ada@example.com"
    assert created["info"]["id"] in {k["id"] for k in login.api_keys()}

    login.revoke_api_key(created["info"]["id"])
    with pytest.raises(autodl.AuthenticationError) as exc:
        temp.me()
    expected = server_error(live, "GET", "/me", headers={"Authorization": f"Bearer {key}"})
    assert exc.value.status == 401 and exc.value.message == expected["message"]
    assert created["info"]["id"] not in {k["id"] for k in login.api_keys()}
    login.close()


def test_wrong_key_raises_authentication_error(live):
    with pytest.raises(autodl.AuthenticationError):
        live.client(api_key="adl_not-a-real-key").nodes()


def test_unreachable_server_raises_connection_error():
    with autodl.Client(api_key="adl_x", base_url="http://127.0.0.1:9") as c:
        with pytest.raises(autodl.AutodlConnectionError):
            c.nodes()


# Submission and scheduling -----------------------------------------------------------------


def test_seed_config_is_submitted_and_scheduled(cluster, client, tracked):
    task = client.submit_task(SEED_CONFIG)
    tracked.append(task)
    assert isinstance(task, autodl.Task) and task.id
    assert task.status == "PENDING"  # as answered by the submission itself
    spec = task.info["spec"]
    assert task.info["name"] == "distributed_mnist"
    assert spec["num_workers"] == 4 and spec["data_path"] == "/data/mnist"
    assert spec["checkpoint"]["save_to"] == "/checkpoints"

    status = wait_for_status(task, "SCHEDULED")
    assert status == "SCHEDULED", (
        f"not scheduled within {SCHEDULE_TIMEOUT} s: {task.info.get('waiting')}"
    )
    placement = task.refresh().placement
    assert placement and {p["node"] for p in placement} <= {n["id"] for n in cluster}
    assert sum(len(p["gpu_indices"]) for p in placement) == 4
    assert task.waiting is None


def test_task_request_places_on_the_requested_gpu_type(cluster, client, tracked):
    deadline = (dt.datetime.now(dt.timezone.utc) + dt.timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    request = TaskRequest(gpu_type="A100-40G", priority=0.8, deadline=deadline)
    task = client.submit_task(small_config("a100-request"), request=request)
    tracked.append(task)
    assert task.info["spec"]["priority"] == 0.8
    assert task.info["spec"]["deadline"]
    assert wait_for_status(task, "SCHEDULED") == "SCHEDULED"
    assert {p["node"] for p in task.refresh().placement} <= nodes_with(cluster, "A100")

    a40 = client.submit_task(small_config("a40-request"), request=TaskRequest(gpu_type="A40"))
    tracked.append(a40)
    assert wait_for_status(a40, "SCHEDULED") == "SCHEDULED"
    assert {p["node"] for p in a40.refresh().placement} == {"node-b"}


def test_template_submit_from_env_and_monitor(live, cluster, tracked, monkeypatch):
    monkeypatch.setenv("AUTODL_API_URL", live.url)
    monkeypatch.setenv("AUTODL_API_KEY", live.api_key)
    template = TaskTemplate(
        name="resnet50_finetune",
        commands=["python train.py --lr 1e-4"],
        resources={"gpu": {"type": "A100", "count": 2}, "cpu": 8, "memory": "32GiB"},
        checkpoint={"interval": 3600, "save_to": "s3://my-bucket/checkpoints"},
    )
    template.set_retry_policy(max_retries=3, oom_recovery=True)
    template.set_affinity(zone="same", bandwidth="high")
    task_id = template.submit()  # client from the environment, as in the article
    assert isinstance(task_id, str)

    monitor = autodl.get_monitor(task_id)
    tracked.append(monitor.task)
    assert monitor.status in ("PENDING", "SCHEDULED")
    spec = monitor.task.info["spec"]
    assert spec["command"] == ["/bin/sh", "-c", "python train.py --lr 1e-4"]
    assert spec["retry_policy"] == {"max_retries": 3, "oom_recovery": True}
    assert spec["checkpoint"] == {"interval": 3600, "save_to": "s3://my-bucket/checkpoints"}
    assert spec["name"] == "resnet50_finetune"

    assert wait_for_status(monitor.task, "SCHEDULED") == "SCHEDULED"
    placement = monitor.task.placement
    assert {p["node"] for p in placement} <= nodes_with(cluster, "A100")
    assert sum(len(p["gpu_indices"]) for p in placement) == 2
    metrics = monitor.get_metrics()
    assert set(metrics) >= {"gpu_util", "mem_used", "mem_total"}


def test_template_with_request_and_explicit_client(cluster, client, tracked):
    template = TaskTemplate("templated-a40", entry_point="train.py", labels={"via": "template"})
    template.set_request(TaskRequest(gpu_type="A40", priority=0.3))
    task = template.submit_task(client)
    tracked.append(task)
    assert task.info["spec"]["priority"] == 0.3 and task.info["spec"]["labels"] == {
        "via": "template"
    }
    assert wait_for_status(task, "SCHEDULED") == "SCHEDULED"
    assert {p["node"] for p in task.refresh().placement} == {"node-b"}


def test_idempotency_key_returns_the_same_task(cluster, client, tracked):
    key = f"run-{uuid.uuid4()}"
    first = client.submit_task(small_config("idem"), idempotency_key=key)
    second = client.submit_task(small_config("idem"), idempotency_key=key)
    tracked.extend([first, second])
    assert first.id == second.id
    other = client.submit_task(small_config("idem"), idempotency_key=f"{key}-2")
    tracked.append(other)
    assert other.id != first.id
    # The same key with a different request is a mistake the server names (422).
    with pytest.raises(autodl.ValidationError) as refused:
        client.submit_task(small_config("idem-changed"), idempotency_key=key)
    assert refused.value.status == 422 and "different request" in refused.value.message


# Validation --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "config,field_hint",
    [
        (small_config("bad-priority", priority=1.5), "priority"),
        (small_config("bad-deadline", deadline="next tuesday"), "deadline"),
        (small_config("bad-env", env={"AUTODL_TASK_ID": "x"}), "AUTODL_"),
        (small_config("unknown-field", gpus=3), "gpus"),
    ],
    ids=["priority", "deadline", "reserved-env", "unknown-field"],
)
def test_invalid_specs_raise_validation_error_with_the_server_message(
    live, cluster, client, config, field_hint
):
    with pytest.raises(autodl.ValidationError) as exc:
        client.submit_task(config)
    expected = server_error(live, "POST", "/tasks", json=autodl.spec.build_spec(config))
    assert exc.value.status == 400
    # The server's words, with a hint in the SDK's own keys where it helps.
    assert exc.value.message.startswith(expected["message"]) and exc.value.code == expected["code"]
    assert field_hint in exc.value.message or exc.value.field == field_hint
    if field_hint == "gpus":
        assert exc.value.message.endswith("did you mean 'gpu_count'?"), exc.value.message


@pytest.mark.parametrize(
    "config",
    [
        small_config("absurd-memory", gpu_memory="4096GiB"),
        small_config("missing-type", gpu_type="H100"),
        small_config("too-many", num_workers=64, gpu_per_worker=8),
    ],
    ids=["gpu-memory", "gpu-type", "gpu-count"],
)
def test_requests_that_never_fit_are_unschedulable(live, cluster, client, config):
    with pytest.raises(autodl.Unschedulable) as exc:
        client.submit_task(config)
    assert isinstance(exc.value, autodl.ValidationError)
    expected = server_error(live, "POST", "/tasks", json=autodl.spec.build_spec(config))
    assert exc.value.code == "unschedulable" and exc.value.message == expected["message"]


def test_client_side_request_validation_never_reaches_the_server():
    with pytest.raises(autodl.ValidationError):
        TaskRequest(priority=2)


# Listing, cancelling, history --------------------------------------------------------------


def test_list_tasks_filters_and_pages(cluster, client, tracked, suite_label):
    a = client.submit_task(small_config("list-a", labels={"suite": suite_label, "kind": "a"}))
    b = client.submit_task(small_config("list-b", labels={"suite": suite_label, "kind": "b"}))
    c = client.submit_task(small_config("list-c", labels={"suite": suite_label, "kind": "a"}))
    tracked.extend([a, b, c])

    ids = [t.id for t in client.list_tasks(label=f"suite={suite_label}")]
    assert ids == [c.id, b.id, a.id]  # newest first
    paged = [t.id for t in client.list_tasks(label=f"suite={suite_label}", page_size=1)]
    assert paged == ids
    assert {t.id for t in client.list_tasks(label={"suite": suite_label, "kind": "a"})} == {
        a.id,
        c.id,
    }
    assert [t.id for t in client.list_tasks(label=f"suite={suite_label}", limit=2)] == [c.id, b.id]

    b.cancel()
    cancelled = {t.id for t in client.list_tasks(state="CANCELLED", label=f"suite={suite_label}")}
    assert cancelled == {b.id}
    mine = {t.id for t in client.list_tasks(user="me", label=f"suite={suite_label}")}
    assert mine == {a.id, b.id, c.id}
    assert all(
        t.info["user_email"] == "ada@example.com" for t in client.list_tasks(user="me", limit=5)
    )
    assert list(client.list_tasks(user=str(uuid.uuid4()), label=f"suite={suite_label}")) == []


def test_get_task_and_not_found(live, client, cluster, tracked):
    task = client.submit_task(small_config("lookup"))
    tracked.append(task)
    again = client.get_task(task.id)
    assert again == task and again.info["name"] == "lookup"
    missing = str(uuid.uuid4())
    with pytest.raises(autodl.NotFound) as exc:
        client.get_task(missing)
    assert exc.value.message == server_error(live, "GET", f"/tasks/{missing}")["message"]


def test_cancel_events_attempts_and_logs(live, cluster, client, tracked):
    task = client.submit_task(small_config("to-cancel"))
    tracked.append(task)
    wait_for_status(task, "SCHEDULED")
    assert task.cancel() == "CANCELLED"
    assert task.get_status() == "CANCELLED" and task.placement is None

    with pytest.raises(autodl.Conflict) as exc:
        task.cancel()
    assert exc.value.status == 409
    assert exc.value.message == server_error(live, "POST", f"/tasks/{task.id}/cancel")["message"]

    events = task.events()
    assert events and all({"at", "kind", "message"} <= set(e) for e in events)
    kinds = [e["kind"] for e in events]
    assert kinds[0] == "submitted" and "cancelled" in kinds

    attempts = task.attempts()
    assert isinstance(attempts, list)

    logs = task.logs()
    assert logs == []
    assert list(task.logs(follow=True)) == []  # the stream ends at once for a finished task

    never_runs = client.submit_task(small_config("never-runs", gpu_type="A40"))
    tracked.append(never_runs)
    with pytest.raises(autodl.TaskTimeout):
        never_runs.wait(timeout=1, poll=0.2)


def test_following_logs_ends_when_the_task_is_cancelled(cluster, client, tracked):
    task = client.submit_task(small_config("follow"))
    tracked.append(task)
    lines: list = []
    ended = threading.Event()

    def follow() -> None:
        lines.extend(task.logs(follow=True))
        ended.set()

    threading.Thread(target=follow, daemon=True).start()
    assert not ended.wait(1.5), "the stream must stay open while the task is live"
    client.get_task(task.id).cancel()
    assert ended.wait(10), "the stream must end once the task is finished"
    assert lines == []


def test_wait_returns_the_final_status(cluster, client):
    task = client.submit_task(small_config("wait-me"))
    task.cancel()
    assert task.wait(timeout=5) == "CANCELLED"


# Metrics and results -----------------------------------------------------------------------


def test_report_metrics_and_monitor(live, cluster, client, tracked, monkeypatch):
    task = client.submit_task(small_config("reporting"))
    tracked.append(task)
    monkeypatch.setenv("AUTODL_TASK_ID", task.id)
    monkeypatch.setenv("AUTODL_API_URL", live.url)
    monkeypatch.setenv("AUTODL_API_KEY", live.api_key)
    monkeypatch.delenv("AUTODL_TASK_TOKEN", raising=False)

    assert autodl.report(epoch=1, loss=0.9, strict=True) is True
    assert autodl.report(epoch=3, loss=0.21, accuracy=0.93, step=300, strict=True) is True

    monitor = autodl.get_monitor(task.id, client=client)
    metrics = monitor.get_metrics()
    assert metrics["epoch"] == 3 and metrics.epoch == 3
    assert metrics["loss"] == pytest.approx(0.21)
    assert metrics["accuracy"] == pytest.approx(0.93) and metrics["step"] == 300
    samples = task.metrics()
    assert len(samples) >= 2 and samples[-1]["epoch"] == 3

    # later reads fetch only newer samples and keep what was reported before
    assert autodl.report(epoch=4, loss=0.18, strict=True) is True
    later = monitor.get_metrics()
    assert later.epoch == 4 and later.loss == pytest.approx(0.18)
    assert later["accuracy"] == pytest.approx(0.93)

    # the platform measures GPU numbers itself; the server refuses them from the task
    with pytest.raises(autodl.ValidationError) as exc:
        autodl.report(gpu_util=0.5, strict=True)
    assert "gpu_util" in exc.value.message


def test_download_results_without_results_is_not_found(live, cluster, client, tracked, tmp_path):
    task = client.submit_task(small_config("no-results"))
    tracked.append(task)
    target = tmp_path / "output"
    with pytest.raises(autodl.NotFound) as exc:
        task.download_results(target)
    expected = server_error(live, "GET", f"/tasks/{task.id}/results")
    assert exc.value.code == "no_results" == expected["code"]
    assert exc.value.message == expected["message"]
    assert not target.exists()


# Command line ------------------------------------------------------------------------------


def test_cli_submit_ls_status_cancel(live, cluster, tmp_path, suite_label, client, tracked):
    config = tmp_path / "task.yaml"
    config.write_text(
        "task_name: cli-task\n"
        "image: pytorch/pytorch:latest\n"
        "entry_point: train.py\n"
        "gpu_per_worker: 1\n"
        "gpu_type: A40\n"
        f"labels:\n  suite: '{suite_label}'\n"
    )
    submitted = cli(live, "submit", str(config), "--idempotency-key", f"cli-{suite_label}")
    assert submitted.returncode == 0, submitted.stderr
    task_id = submitted.stdout.strip()
    tracked.append(client.task(task_id))
    again = cli(live, "submit", str(config), "--idempotency-key", f"cli-{suite_label}")
    assert again.stdout.strip() == task_id

    listed = cli(live, "ls", "--label", f"suite={suite_label}")
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert header.split()[:4] == ["#", "ID", "NAME", "STATUS"]
    assert len(rows) == 1 and rows[0].split()[1] == task_id and "cli-task" in rows[0]

    status = cli(live, "status", task_id)
    assert status.returncode == 0 and task_id in status.stdout
    assert any(s in status.stdout for s in ("PENDING", "SCHEDULED"))
    as_json = json.loads(cli(live, "status", task_id, "--json").stdout)
    assert as_json["id"] == task_id and as_json["spec"]["labels"] == {"suite": suite_label}
    # Its number and a prefix of its id reach it as well as its id does.
    assert rows[0].split()[0] == f"#{as_json['number']}"
    for other_name in (f"#{as_json['number']}", str(as_json["number"]), task_id[:13]):
        again_status = cli(live, "status", other_name, "--json")
        assert again_status.returncode == 0, again_status.stderr
        assert json.loads(again_status.stdout)["id"] == task_id

    cancelled = cli(live, "cancel", task_id, console_script=True)
    assert cancelled.returncode == 0 and "CANCELLED" in cancelled.stdout
    twice = cli(live, "cancel", task_id)
    assert twice.returncode == 1
    assert server_error(live, "POST", f"/tasks/{task_id}/cancel")["message"] in twice.stderr

    by_state = cli(live, "ls", "--state", "cancelled", "--label", f"suite={suite_label}")
    assert task_id in by_state.stdout

    logs = cli(live, "logs", task_id)
    assert logs.returncode == 0 and logs.stdout == ""
    download = cli(live, "download", task_id, str(tmp_path / "out"))
    assert download.returncode == 1
    assert server_error(live, "GET", f"/tasks/{task_id}/results")["message"] in download.stderr


def test_cli_nodes_and_errors(live, cluster, tmp_path):
    nodes = cli(live, "nodes")
    assert nodes.returncode == 0, nodes.stderr
    assert "node-a" in nodes.stdout and "4xA100-40G" in nodes.stdout and "4xA40" in nodes.stdout

    bad_key = cli(live, "ls", api_key="adl_wrong")
    assert bad_key.returncode == 1 and bad_key.stderr.startswith("autodl: error:")
    global_opts = cli(live, "--api-url", live.url, "--api-key", live.api_key, "ls", "--limit", "1")
    assert global_opts.returncode == 0, global_opts.stderr

    bad = tmp_path / "bad.yaml"
    bad.write_text("task_name: x\nimage: i\nentry_point: t.py\npriority: 7\n")
    refused = cli(live, "submit", str(bad))
    assert refused.returncode == 1 and "priority" in refused.stderr

    missing_id = str(uuid.uuid4())
    missing = cli(live, "status", missing_id)
    assert missing.returncode == 1
    assert server_error(live, "GET", f"/tasks/{missing_id}")["message"] in missing.stderr
