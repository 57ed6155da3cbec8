"""CLI behaviour that needs no server: argument parsing, config files, exit codes."""

import json

import pytest
import yaml

from autodl import cli


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([])
    assert exc.value.code == 2
    with pytest.raises(SystemExit):
        cli.main(["frobnicate"])


def test_global_options_before_or_after_the_command():
    parser = cli.build_parser()
    a = parser.parse_args(["--api-url", "http://x:1", "ls", "--state", "running"])
    b = parser.parse_args(["ls", "--api-url", "http://x:1", "--label", "a=b", "--label", "c=d"])
    assert a.api_url == b.api_url == "http://x:1"
    assert a.state == ["running"] and b.label == ["a=b", "c=d"]
    assert cli._states(["running,pending", "RUNNING"]) == ["running", "pending"]
    assert cli._states(None) == [None]
    run = parser.parse_args(
        ["run", "--gpus", "A100:2", "-d", "--", "python", "train.py", "--lr", "3"]
    )
    assert run.cmd == ["--", "python", "train.py", "--lr", "3"] and run.detach
    assert cli._gpu_request("A100:2") == {"type": "A100", "count": 2}
    assert cli._gpu_request("4") == {"count": 4}
    assert cli._gpu_request("H100") == {"type": "H100", "count": 1}
    assert parser.parse_args(["cancel", "a", "b"]).ids == ["a", "b"]
    assert parser.parse_args(["download", "t1"]).dir == "./output"
    assert parser.parse_args(["logs", "t1", "-f"]).follow is True


def test_missing_or_bad_config_file_is_a_clear_error(tmp_path, capsys):
    assert cli.main(["--api-url", "http://127.0.0.1:9", "submit", str(tmp_path / "nope.yaml")]) == 1
    assert "nope.yaml" in capsys.readouterr().err
    bad = tmp_path / "list.yaml"
    bad.write_text("- just\n- a list\n")
    assert cli.main(["--api-url", "http://127.0.0.1:9", "submit", str(bad)]) == 1
    assert "expected a mapping" in capsys.readouterr().err
    # A syntax error names the file and the place.
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nresources: {gpu: [\n")
    assert cli.main(["--api-url", "http://127.0.0.1:9", "submit", str(broken)]) == 1
    err = capsys.readouterr().err
    assert "broken.yaml is not valid YAML" in err and "line" in err, err
    broken_json = tmp_path / "broken.json"
    broken_json.write_text('{"name": "x",}')
    assert cli.main(["--api-url", "http://127.0.0.1:9", "submit", str(broken_json)]) == 1
    assert "broken.json is not valid JSON" in capsys.readouterr().err


def test_unreachable_server_exits_1(tmp_path, capsys):
    config = tmp_path / "t.json"
    config.write_text('{"task_name": "x", "image": "i", "entry_point": "t.py"}')
    assert cli.main(["--api-url", "http://127.0.0.1:9", "submit", str(config)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("autodl: error: cannot reach the autodl server at http://127.0.0.1:9")


def test_gpu_summary_reads_the_normalised_spec():
    spec = {"gpus_per_worker": 2, "num_workers": 3, "gpu_types": ["A100"]}
    assert cli._gpus({"spec": spec}) == "6xA100"
    assert cli._gpus({"spec": {"gpus_per_worker": 1, "num_workers": 1, "gpu_types": []}}) == "1xany"
    assert cli._gpus({"spec": {"gpus_per_worker": 0}}) == "-"


def test_article_spelling_alias():
    from aotodl.scheduler import TaskRequest

    import aotodl
    import autodl

    assert aotodl.Client is autodl.Client and TaskRequest is autodl.TaskRequest


def test_show_prints_the_estimated_start():
    import io

    from autodl.task import Task

    info = {
        "id": "t1",
        "name": "n",
        "state": "pending",
        "spec": {"gpus_per_worker": 1, "num_workers": 1, "gpu_types": []},
        "waiting": {
            "reason": "resources",
            "message": "waiting for free resources",
            "position": 0,
            "estimated_start": "2026-12-01T17:00:00Z",
        },
    }
    task = Task(None, info)  # type: ignore[arg-type]
    out = io.StringIO()
    cli._print_task(task, out)
    assert f"starts:   {cli._when('2026-12-01T17:00:00Z')}" in out.getvalue()
    # First in line reads as `autodl queue` and the page say it: position 1.
    assert "(position 1)" in out.getvalue(), out.getvalue()
    assert task.estimated_start == "2026-12-01T17:00:00Z"
    info["waiting"]["estimated_start"] = None
    out = io.StringIO()
    cli._print_task(task, out)
    assert "starts:   not estimated yet" in out.getvalue()


def test_login_saves_a_profile_the_client_then_uses(tmp_path, monkeypatch, capsys):
    import httpx

    from autodl import Client, profiles

    seen = []

    def handler(request):
        seen.append(request)
        assert request.headers["authorization"] == "Bearer adl_saved"
        return httpx.Response(200, json={"email": "ada@example.com", "tenant_name": "Lab"})

    real_client = Client

    def with_transport(*a, **kw):
        kw.setdefault("transport", httpx.MockTransport(handler))
        return real_client(*a, **kw)

    monkeypatch.setattr(cli, "Client", with_transport)
    config = tmp_path / "autodl-config"
    monkeypatch.setenv("AUTODL_CONFIG", str(config))
    monkeypatch.delenv("AUTODL_API_URL", raising=False)
    monkeypatch.delenv("AUTODL_API_KEY", raising=False)
    argv = [
        "login",
        "--api-url",
        "http://srv:9/api/v1",
        "--api-key",
        "adl_saved",
        "--profile",
        "lab",
    ]
    assert cli.main(argv) == 0
    assert "as ada@example.com (Lab); saved as profile 'lab'" in capsys.readouterr().out
    assert oct(config.stat().st_mode & 0o777) == "0o600"
    assert profiles.load_profile("lab") == {"api_url": "http://srv:9", "api_key": "adl_saved"}
    # Client() reads the chosen profile; the environment still wins over it.
    monkeypatch.setenv("AUTODL_PROFILE", "lab")
    c = real_client()
    assert (c.base_url, c.api_key) == ("http://srv:9", "adl_saved")
    monkeypatch.setenv("AUTODL_API_URL", "http://other:1")
    assert real_client().base_url == "http://other:1"
    # Another profile is added beside it.
    monkeypatch.delenv("AUTODL_PROFILE")
    argv = ["login", "--api-url", "http://srv:9", "--api-key", "adl_saved"]
    assert cli.main(argv) == 0
    assert set(profiles.profiles()) == {"lab", "default"}


def test_cancel_reports_each_task(monkeypatch, capsys):
    import httpx

    from autodl import Client

    def handler(request):
        task_id = request.url.path.split("/")[-2]
        if task_id == "done":
            return httpx.Response(
                409, json={"error": {"code": "conflict", "message": "task already completed"}}
            )
        return httpx.Response(200, json={"id": task_id, "state": "cancelled", "spec": {}})

    monkeypatch.setattr(
        cli,
        "Client",
        lambda *a, **kw: Client(*a, transport=httpx.MockTransport(handler), **kw),
    )
    assert cli.main(["--api-url", "http://srv:9", "cancel", "a", "done", "b"]) == 1
    captured = capsys.readouterr()
    assert captured.out.splitlines() == ["a CANCELLED", "b CANCELLED"]
    assert captured.err.startswith("autodl: error: done not cancelled: task already completed")


def _cancel_server(monkeypatch, cancelled):
    import httpx

    from autodl import Client

    def handler(request):
        if request.method == "GET":
            state = request.url.params.get("state")
            items = [{"id": "r1", "state": "running", "spec": {}}] if state == "running" else []
            return httpx.Response(200, json={"items": items, "next_cursor": None})
        task_id = request.url.path.split("/")[-2]
        cancelled.append(task_id)
        return httpx.Response(200, json={"id": task_id, "state": "cancelled", "spec": {}})

    monkeypatch.setattr(
        cli,
        "Client",
        lambda *a, **kw: Client(*a, transport=httpx.MockTransport(handler), **kw),
    )


def test_cancel_by_label_asks_first_and_without_a_terminal_cancels_nothing(monkeypatch, capsys):
    cancelled = []
    _cancel_server(monkeypatch, cancelled)
    monkeypatch.setattr(cli.sys.stdin, "isatty", lambda: False, raising=False)
    assert cli.main(["--api-url", "http://srv:9", "cancel", "--label", "a=b"]) == 1
    assert "1 task(s) match --label a=b" in capsys.readouterr().err
    assert cancelled == []
    assert cli.main(["--api-url", "http://srv:9", "cancel", "--label", "a=b", "--yes"]) == 0
    assert cancelled == ["r1"]


def test_a_reader_that_goes_away_ends_the_command_quietly(monkeypatch, capsys):
    def closed(client, args, out):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(cli, "cmd_status", closed)
    assert cli.main(["--api-url", "http://srv:9", "status", "t"]) == 141
    assert capsys.readouterr().err == ""


def test_times_are_local_and_samples_read_as_people_read_them(monkeypatch):
    monkeypatch.setenv("TZ", "Asia/Shanghai")
    import time

    time.tzset()
    try:
        assert cli._when("2026-12-01T17:00:00Z") == "2026-12-02 01:00:00"
        assert cli._when(None) == "-"
        assert cli._when("not a time") == "not a time"
    finally:
        monkeypatch.delenv("TZ")
        time.tzset()
    assert cli._sample_cell("gpu_util", 0.734) == "73%"
    assert cli._sample_cell("mem_used", 12 * 2**30) == "12.0 GiB"
    assert cli._sample_cell("loss", 0.012345678) == "0.0123457"
    assert cli._sample_cell("step", 7) == "7"
    assert cli._sample_cell("loss", None) == "-"


def test_export_clone_and_retry_send_the_spec_the_server_handed_out(monkeypatch, capsys):
    import httpx

    from autodl import Client

    exported = {
        "name": "train",
        "image": "pytorch:2",
        "command": "python train.py",
        "env": {"LR": "0.1"},
        "resources": {"gpu": {"count": 1}},
        "priority": 0.5,
    }
    submitted = []

    def handler(request):
        if request.method == "GET" and request.url.path.endswith("/spec"):
            return httpx.Response(200, json=exported)
        if request.method == "POST" and request.url.path.endswith("/tasks"):
            submitted.append(json.loads(request.content))
            return httpx.Response(201, json={"id": f"new{len(submitted)}", "state": "pending"})
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "no"}})

    monkeypatch.setattr(
        cli,
        "Client",
        lambda *a, **kw: Client(*a, transport=httpx.MockTransport(handler), **kw),
    )
    base = ["--api-url", "http://srv:9"]
    assert cli.main([*base, "export", "t1"]) == 0
    assert yaml.safe_load(capsys.readouterr().out) == exported
    assert cli.main([*base, "retry", "t1"]) == 0
    assert submitted[-1] == exported
    argv = [*base, "clone", "t1", "--set", "priority=0.9", "--set", "env.LR=3e-4"]
    assert cli.main(argv) == 0
    assert submitted[-1]["priority"] == 0.9
    assert submitted[-1]["env"] == {"LR": "3e-4"}
    assert capsys.readouterr().out.split() == ["new1", "new2"]
