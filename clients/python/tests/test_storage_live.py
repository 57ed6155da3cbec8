"""Checkpoints, results and data through the SDK, on a ``serve --demo`` server whose simulated
GPU agents really run the tasks (as local processes)."""

from __future__ import annotations

import json
import os
import sys
import time

import httpx
import pytest
from conftest import LiveServer

import autodl

pytestmark = pytest.mark.live


def shell_task(name: str, command: str, **extra) -> dict:
    return {
        "name": name,
        "image": "none",
        "command": command,
        "resources": {"gpu": {"count": 1}},
        **extra,
    }


def test_results_download_matches_what_the_task_wrote(demo: LiveServer, tmp_path):
    client = demo.client()
    task = client.submit_spec(
        shell_task(
            "results",
            'mkdir -p "$AUTODL_RESULTS_DIR/metrics" '
            '&& printf "accuracy 0.97\\n" > "$AUTODL_RESULTS_DIR/summary.txt" '
            '&& seq 1 50000 > "$AUTODL_RESULTS_DIR/metrics/steps.csv"',
        )
    )
    assert task.wait(timeout=60) == "COMPLETED", task.logs()
    out = task.download_results(tmp_path / "out")
    assert (out / "summary.txt").read_text() == "accuracy 0.97\n"
    assert (out / "metrics" / "steps.csv").read_text() == "".join(f"{i}\n" for i in range(1, 50001))
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == [
        "metrics/steps.csv",
        "summary.txt",
    ]


TRAIN = """
import os, time, autodl
ckpt = autodl.checkpoint.directory() / "state.txt"
step = 0
if autodl.env.is_restored:
    step = int((autodl.checkpoint.restore_path() / "state.txt").read_text())
    print("resumed from step", step, flush=True)
while step < 40:
    step += 1
    autodl.checkpoint.write_atomic(ckpt, lambda f: f.write(str(step).encode()))
    autodl.checkpoint.save_now(step=step)
    print("step", step, flush=True)
    time.sleep(0.25)
if autodl.env.results_dir:
    open(os.path.join(autodl.env.results_dir, "final.txt"), "w").write(str(step))
"""


def test_a_drained_task_resumes_from_its_checkpoint(demo: LiveServer, tmp_path):
    client = demo.client()
    script = demo.code_dir / "train.py"
    script.write_text(TRAIN)
    task = client.submit_spec(
        shell_task(
            "resume",
            f'"{sys.executable}" "{script}"',
            checkpoint={"interval": 30, "keep": 2},
        )
    )
    deadline = time.monotonic() + 60
    while len(task.checkpoints()) < 1 or task.refresh().status != "RUNNING":
        assert time.monotonic() < deadline, task.logs()
        time.sleep(0.3)
    time.sleep(2)
    node = task.refresh().placement[0]["node"]
    with httpx.Client(
        base_url=demo.url + "/api/v1",
        headers={"Authorization": f"Bearer {demo.admin_token}"},
        timeout=15,
    ) as admin:
        assert admin.post(f"/admin/nodes/{node}/drain").status_code == 204
        try:
            assert task.wait(timeout=90) == "COMPLETED", task.logs()
        finally:
            admin.post(f"/admin/nodes/{node}/uncordon")
    logs = "\n".join(task.logs())
    resumed = [
        int(line.split()[-1]) for line in logs.splitlines() if line.startswith("resumed from step")
    ]
    assert resumed and resumed[0] > 0, logs
    attempts = task.attempts()
    assert len(attempts) == 2 and attempts[0]["reason"] == "drained"
    assert attempts[1]["node"] != node
    checkpoints = task.checkpoints()
    assert 1 <= len(checkpoints) <= 2
    assert checkpoints[0]["step"] >= resumed[0]
    out = task.download_results(tmp_path / "out")
    assert (out / "final.txt").read_text() == "40"


def test_demo_tasks_see_neither_the_servers_secrets_nor_its_files(demo: LiveServer, tmp_path):
    """The demo's agents run inside the server process: a task must not inherit its
    environment (the JWT secret, the database URL) nor read its database and objects."""
    if os.geteuid() != 0:
        pytest.skip("the demo isolates its tasks only when it runs as root")
    client = demo.client()
    task = client.submit_spec(
        shell_task(
            "snoop",
            f'env; for f in "{demo.tmp}/a.db" "{demo.log}"; do '
            'cat "$f" >/dev/null 2>&1 && echo "LEAK $f"; done; '
            'cat /proc/1/environ 2>/dev/null | tr "\\0" "\\n" | grep -q JWT && echo "LEAK pid 1"; '
            "echo snooped",
        )
    )
    assert task.wait(timeout=60) == "COMPLETED", task.logs()
    out = "\n".join(task.logs())
    assert "snooped" in out
    assert "LEAK" not in out, out
    assert demo.jwt_secret not in out
    for name in ("AUTODL_JWT_SECRET", "AUTODL_DATABASE_URL", "AUTODL_STORAGE_URL", "RUST_LOG"):
        assert f"{name}=" not in out, out


def test_data_uploaded_through_the_sdk_reaches_the_task(demo: LiveServer, tmp_path):
    client = demo.client()
    data = tmp_path / "dataset"
    (data / "shards").mkdir(parents=True)
    (data / "labels.txt").write_text("cat\ndog\n")
    (data / "shards" / "0.bin").write_bytes(bytes(range(256)) * 100)
    stored = client.upload_data(data, "s3://autodl/datasets/pets")
    assert sorted(s["path"] for s in stored) == [
        "datasets/pets/labels.txt",
        "datasets/pets/shards/0.bin",
    ]
    listed = client.list_data("s3://autodl/datasets/pets")
    assert {o["path"]: o["size"] for o in listed} == {
        "datasets/pets/labels.txt": 8,
        "datasets/pets/shards/0.bin": 25600,
    }
    client.download_data("s3://autodl/datasets/pets/labels.txt", tmp_path / "back.txt")
    assert (tmp_path / "back.txt").read_text() == "cat\ndog\n"
    task = client.submit_spec(
        shell_task(
            "reads-data",
            'cat "$AUTODL_DATA_PATH/labels.txt"; wc -c < "$AUTODL_DATA_PATH/shards/0.bin"',
            data_path="s3://autodl/datasets/pets",
        )
    )
    assert task.wait(timeout=60) == "COMPLETED", task.logs()
    logs = task.logs()
    assert "cat" in logs and "dog" in logs and "25600" in [line.strip() for line in logs], logs
    with pytest.raises(autodl.ValidationError):
        client.submit_spec(shell_task("bad", "true", data_path="s3://not-allowed/x"))
    # A data path with nothing stored under it is refused, naming the field.
    with pytest.raises(autodl.ValidationError) as empty:
        client.submit_spec(
            shell_task("empty", "true", data_path="s3://autodl/datasets/not-uploaded")
        )
    assert empty.value.field == "data_path" and "nothing is stored" in empty.value.message
    with pytest.raises(autodl.ValidationError) as bad_url:
        client.upload_data(data, "/not/a/url")
    assert bad_url.value.field == "url" and "s3://" in bad_url.value.message
    with pytest.raises(autodl.ValidationError) as missing:
        client.upload_data(tmp_path / "no-such-folder", "s3://autodl/datasets/x")
    assert missing.value.field == "local"


def test_cli_runs_follows_and_explains_a_command(demo: LiveServer):
    from conftest import cli

    done = cli(
        demo,
        "run",
        "--gpus",
        "1",
        "--image",
        "busybox",
        "--name",
        "cli-run",
        "--",
        "sh",
        "-c",
        "echo hello from run; echo to stderr >&2",
    )
    assert done.returncode == 0, done.stderr
    task_id, *lines = done.stdout.splitlines()
    assert "hello from run" in lines, done.stdout
    assert f"{task_id} COMPLETED" in done.stderr
    failed = cli(demo, "run", "--gpus", "A40:1", "--", "sh", "-c", "echo bye; exit 3")
    assert failed.returncode == 1, failed.stderr
    failed_id = failed.stdout.splitlines()[0]
    status = cli(demo, "status", failed_id)
    # On either A40 node of the demo.
    assert "ended:    error, exit code 3 on demo-a40" in status.stdout, status.stdout
    attempts = cli(demo, "attempts", failed_id)
    # Times are local and read "2026-12-07 12:00:00": two words each (STARTED, ENDED).
    assert attempts.stdout.splitlines()[1].split()[6:8] == ["3", "error"], attempts.stdout
    events = cli(demo, "events", failed_id)
    assert "failed" in events.stdout, events.stdout
    # Detached, it waits in the queue view; one call cancels several.
    held = [
        cli(demo, "run", "-d", "--gpus", "A100:4", "--label", "batch=cli", "--", "sleep", "60")
        for _ in range(3)
    ]
    ids = [h.stdout.strip() for h in held]
    assert all(h.returncode == 0 for h in held), [h.stderr for h in held]
    queue = cli(demo, "queue")
    assert queue.returncode == 0 and all(i in queue.stdout for i in ids), queue.stdout
    assert queue.stdout.splitlines()[0].split()[:5] == ["#", "ID", "NAME", "USER", "STATE"]
    # Once the scheduler has looked at them, the waiting ones say where they stand and why.
    deadline = time.monotonic() + 30
    while True:
        rows = [r.split(None, 8) for r in cli(demo, "queue").stdout.splitlines()[1:]]
        waiting = [r for r in rows if r[1] in ids and r[4] == "PENDING"]
        if waiting and all(r[6].isdigit() and r[8] != "-" for r in waiting):
            break
        assert time.monotonic() < deadline, rows
        time.sleep(0.5)
    assert len({r[6] for r in waiting}) == len(waiting), f"one place each: {waiting}"
    assert all("T" in r[7] or r[7] == "unknown" for r in waiting), waiting
    listed = cli(demo, "ls", "--state", "pending,scheduled,running", "--label", "batch=cli")
    assert sorted(line.split()[1] for line in listed.stdout.splitlines()[1:]) == sorted(ids)
    # Without --yes and without a terminal to ask on, a label cancels nothing.
    refused = cli(demo, "cancel", "--label", "batch=cli")
    assert refused.returncode == 1 and "--yes" in refused.stderr, refused.stderr
    cancelled = cli(demo, "cancel", "--label", "batch=cli", "--yes")
    assert cancelled.returncode == 0, cancelled.stdout
    assert sorted(line.split()[0] for line in cancelled.stdout.splitlines()) == sorted(ids)


def test_a_run_over_its_time_limit_is_stopped_and_ends_timed_out(demo: LiveServer):
    client = demo.client()
    task = client.submit_spec(shell_task("limited", "echo started; sleep 120", time_limit="3s"))
    assert task.wait(timeout=90) == autodl.task.TIMED_OUT, task.events()
    assert "started" in task.logs()
    (run,) = task.attempts()
    assert run["reason"] == "timed_out"
    assert any("time limit of 3s" in e["message"] for e in task.events()), task.events()


def test_tasks_start_after_the_tasks_they_name(demo: LiveServer):
    client = demo.client()
    first = client.submit_spec(shell_task("first", "sleep 2; exit 1"))
    needs_ok = client.submit_task(shell_task("needs-ok", "echo never"), after=first)
    needs_end = client.submit_task(
        shell_task("needs-end", "echo after the first"), after=[first.id], after_when="any"
    )
    waiting = needs_ok.refresh().waiting or {}
    assert waiting.get("reason") in (None, "dependency"), waiting
    assert first.wait(timeout=60) == "FAILED"
    assert needs_ok.wait(timeout=60) == "CANCELLED", needs_ok.events()
    assert needs_end.wait(timeout=60) == "COMPLETED", needs_end.events()
    assert "after the first" in needs_end.logs()


def test_a_workdir_travels_with_the_task_and_is_uploaded_once(demo: LiveServer, tmp_path):
    client = demo.client()
    project = tmp_path / "project"
    (project / "lib").mkdir(parents=True)
    (project / "outputs").mkdir()
    (project / "train.py").write_text(
        "import os, lib.model\nprint('trained', lib.model.NAME, 'in', os.getcwd())\n"
        "print('outputs' in os.listdir('.'), 'secret.txt' in os.listdir('.'))\n"
    )
    (project / "lib" / "__init__.py").write_text("")
    (project / "lib" / "model.py").write_text("NAME = 'tiny-net'\n")
    (project / "outputs" / "big.ckpt").write_bytes(b"0" * 1000)
    (project / "secret.txt").write_text("left out\n")
    (project / ".gitignore").write_text("outputs/\n")
    (project / ".autodlignore").write_text("secret.txt\n")
    python = sys.executable
    first = client.submit_task(shell_task("with-code", f"{python} train.py"), workdir=project)
    assert first.wait(timeout=60) == "COMPLETED", first.logs()
    logs = first.logs()
    assert any(line.startswith("trained tiny-net in ") for line in logs), logs
    assert "False False" in logs, logs
    # The same folder again: nothing is uploaded, the task names the same bundle.
    again = client.upload_code(project)
    assert again["uploaded"] is False and again["id"] == first.refresh().info["spec"]["code"]
    # A change is a new bundle.
    (project / "lib" / "model.py").write_text("NAME = 'bigger-net'\n")
    changed = client.upload_code(project)
    assert changed["uploaded"] is True and changed["id"] != again["id"]
    with pytest.raises(autodl.ValidationError) as missing:
        client.submit_task(shell_task("no-code", "true"), workdir=tmp_path / "nope")
    assert missing.value.field == "workdir"


def test_a_sweep_runs_its_trials_a_few_at_a_time_and_compares_them(demo: LiveServer, tmp_path):
    from conftest import cli

    client = demo.client()
    project = tmp_path / "sweep-project"
    project.mkdir()
    (project / "train.py").write_text(
        "import sys, autodl\nlr = float(sys.argv[1])\n"
        "autodl.report(epoch=3, loss=abs(lr - 0.01) * 10)\nprint('trained with', lr)\n"
    )
    sweep = client.submit_sweep(
        shell_task("lr-${lr}", "python train.py ${lr}"),
        workdir=project,
        parameters={"lr": [0.1, 0.01, 0.001]},
        max_concurrency=1,
        name="lr-search",
    )
    assert sweep.trials == 3 and len(sweep.rows) == 3
    states = sweep.wait(timeout=120, poll=0.5)
    assert states == {"completed": 3}, sweep.rows
    best = sweep.best("loss")
    assert best is not None and best["params"] == {"lr": 0.01}, sweep.rows
    assert best["metrics"]["epoch"] == 3 and isinstance(best["metrics"]["epoch"], int)
    assert "trained with 0.01" in client.get_task(best["task_id"]).logs()
    # Never more than one trial ran at once: their runs do not overlap.
    runs = sorted((a["started_at"], a["ended_at"]) for t in sweep.tasks() for a in t.attempts())
    assert all(prev[1] <= nxt[0] for prev, nxt in zip(runs, runs[1:])), runs
    shown = cli(demo, "sweep", "show", sweep.id)
    assert shown.returncode == 0, shown.stderr
    assert "lr-search  grid  3 trials (at most 1 at once): 3 completed" in shown.stdout
    # A random sweep from the CLI, cancelled as one.
    task = tmp_path / "sleep.yaml"
    task.write_text(
        "name: nap\nimage: none\ncommand: sleep ${secs}\nresources:\n  gpu: {count: 1}\n"
    )
    ran = cli(
        demo,
        "sweep",
        "run",
        str(task),
        "--param",
        "secs=100:200:int",
        "--samples",
        "12",
        "--seed",
        "3",
        "--max-concurrency",
        "2",
        "--json",
    )
    assert ran.returncode == 0, ran.stderr
    sweep_id = json.loads(ran.stdout)["id"]
    assert cli(demo, "sweep", "show", sweep_id).stdout.count("pending") >= 10
    listed = cli(demo, "sweep", "ls")
    assert sweep_id in listed.stdout and "12" in listed.stdout
    cancelled = cli(demo, "sweep", "cancel", sweep_id)
    assert cancelled.stdout.strip() == f"{sweep_id}: 12 trials cancelled", cancelled.stdout
    assert client.get_sweep(sweep_id).wait(timeout=60, poll=0.5) == {"cancelled": 12}


def _wheel(path, name: str, greeting: str) -> None:
    """A wheel of package ``name`` (a wheel is a zip file): installed with no index."""
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}/__init__.py", f"GREETING = {greeting!r}\n")
        z.writestr(
            f"{name}-0.1.dist-info/METADATA",
            f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.1\n",
        )
        z.writestr(
            f"{name}-0.1.dist-info/WHEEL",
            "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        )
        z.writestr(f"{name}-0.1.dist-info/RECORD", "")


def test_requirements_are_installed_once_per_node_and_reused(demo: LiveServer, tmp_path):
    client = demo.client()
    project = tmp_path / "env-project"
    (project / "wheels").mkdir(parents=True)
    _wheel(project / "wheels" / "hello_env-0.1-py3-none-any.whl", "hello_env", "hello from pip")
    (project / "requirements.txt").write_text(
        "--no-index\n./wheels/hello_env-0.1-py3-none-any.whl\n"
    )
    (project / "train.py").write_text(
        "import sys, autodl, hello_env\n"
        "print(hello_env.GREETING, 'in', sys.prefix)\n"
        "autodl.report(step=1, loss=0.5)\n"
    )
    # Both on the one-node-of-its-kind A100 node, so the second finds the first's build.
    spec = shell_task(
        "with-requirements",
        "python train.py",
        requirements="requirements.txt",
        resources={"gpu": {"type": "A100-40G", "count": 1}},
    )
    took = []
    logs = []
    for _ in range(2):
        start = time.monotonic()
        task = client.submit_task(spec, workdir=project)
        assert task.wait(timeout=180) == "COMPLETED", task.logs()
        took.append(time.monotonic() - start)
        logs.append("\n".join(task.logs()))
    first, second = logs
    assert "pip install -r requirements.txt" in first and "built in" in first, first
    assert "hello from pip in /autodl/env" in first or "hello from pip in /" in first, first
    assert "reused" in second and "pip install" not in second, second
    assert "hello from pip" in second, second
    print(f"\nfirst task (builds its environment) {took[0]:.1f} s, second (reuses it) {took[1]:.1f} s")
    # A requirements file that is not in the code fails the task, saying so.
    missing = client.submit_task({**spec, "requirements": "nope.txt"}, workdir=project)
    assert missing.wait(timeout=60) == "FAILED"
    assert any("nope.txt is not a file in the task's code" in line for line in missing.logs())
