"""Sweeps in the SDK and CLI, against a mock server: one request to submit, one to cancel."""

from __future__ import annotations

import json

import httpx
import pytest

import autodl
from autodl.cli import _param, main


def test_params_are_lists_or_ranges():
    assert _param("lr=0.1,0.01,1e-3") == ("lr", [0.1, 0.01, 0.001])
    assert _param("opt=adam,sgd") == ("opt", ["adam", "sgd"])
    assert _param("bs=32") == ("bs", [32])
    assert _param("lr=1e-5:1e-1:log") == ("lr", {"min": 1e-5, "max": 0.1, "log": True})
    assert _param("layers=2:8:int") == ("layers", {"min": 2, "max": 8, "integer": True})
    assert _param("tag=a:b") == ("tag", ["a:b"])
    for bad in ("lr", "=1", "lr=", "x=1:2:cubic"):
        with pytest.raises(autodl.ValidationError):
            _param(bad)


def mock_server(seen):
    sweep = {
        "id": "sw1",
        "name": "lr",
        "user_email": "a@b.c",
        "method": "grid",
        "max_concurrency": 2,
        "trials": 2,
        "created_at": "2026-12-02T00:00:00Z",
        "parameters": ["lr"],
        "states": {"completed": 2},
        "items": [
            {
                "trial": 0,
                "task_id": "t0",
                "state": "completed",
                "params": {"lr": 0.1},
                "metrics": {"loss": 0.5},
            },
            {
                "trial": 1,
                "task_id": "t1",
                "state": "completed",
                "params": {"lr": 0.01},
                "metrics": {"loss": 0.2, "epoch": 3},
            },
        ],
    }

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path, json.loads(request.content or b"null")))
        if request.url.path == "/api/v1/sweeps" and request.method == "POST":
            return httpx.Response(201, json=sweep)
        if request.url.path == "/api/v1/sweeps/sw1/cancel":
            return httpx.Response(200, json={"cancelled": 2})
        if request.url.path == "/api/v1/sweeps/sw1":
            return httpx.Response(200, json=sweep)
        return httpx.Response(404, json={"error": {"code": "not_found", "message": "no"}})

    return httpx.MockTransport(handler)


def test_submit_sweep_sends_one_request_with_the_template():
    seen = []
    client = autodl.Client(api_key="k", base_url="http://x", transport=mock_server(seen))
    sweep = client.submit_sweep(
        {"task_name": "lr", "image": "i", "command": "python train.py --lr ${lr}", "gpu_count": 1},
        parameters={"lr": [0.1, 0.01]},
        max_concurrency=2,
    )
    (method, path, body) = seen[0]
    assert (method, path) == ("POST", "/api/v1/sweeps")
    assert body["template"]["name"] == "lr" and body["template"]["resources"]["gpu"]["count"] == 1
    assert body["parameters"] == {"lr": [0.1, 0.01]} and body["max_concurrency"] == 2
    assert sweep.done and sweep.best("loss")["params"] == {"lr": 0.01}
    assert sweep.best("loss", mode="max")["trial"] == 0
    assert sweep.cancel() == 2
    with pytest.raises(autodl.ValidationError):
        client.submit_sweep({"name": "x"}, parameters={"lr": "0.1"})


def test_cli_sweep_run_show_and_cancel(tmp_path, monkeypatch, capsys):
    seen = []
    transport = mock_server(seen)
    real = autodl.Client.__init__

    def with_mock(self, *a, **k):
        k["transport"] = transport
        real(self, *a, **k)

    monkeypatch.setattr(autodl.Client, "__init__", with_mock)
    monkeypatch.setenv("AUTODL_API_KEY", "k")
    task = tmp_path / "task.yaml"
    task.write_text("name: lr\nimage: i\ncommand: python train.py --lr ${lr}\n")
    assert (
        main(["sweep", "run", str(task), "--param", "lr=0.1,0.01", "--max-concurrency", "2"]) == 0
    )
    assert capsys.readouterr().out == "sw1\n"
    assert main(["sweep", "show", "sw1"]) == 0
    out = capsys.readouterr().out
    assert "sw1  lr  grid  2 trials (at most 2 at once): 2 completed" in out
    lines = out.splitlines()
    assert lines[1].split() == ["TRIAL", "STATE", "lr", "epoch", "loss", "TASK"]
    assert lines[3].split() == ["1", "completed", "0.01", "3", "0.2", "t1"]
    assert seen[0][2]["parameters"] == {"lr": [0.1, 0.01]}
    assert main(["sweep", "cancel", "sw1"]) == 0
    assert "sw1: 2 trials cancelled" in capsys.readouterr().out
    assert main(["sweep", "run", str(task), "--param", "bad"]) == 1


def test_an_asha_sweep_names_its_metric_and_best_skips_stopped_trials():
    seen = []
    client = autodl.Client(api_key="k", base_url="http://x", transport=mock_server(seen))
    sweep = client.submit_sweep(
        {"task_name": "lr", "image": "i", "command": "python train.py --lr ${lr}", "gpu_count": 1},
        parameters={"lr": [0.1, 0.01]},
        method="asha",
        metric="loss",
        max_resource=27,
        reduction_factor=3,
    )
    body = seen[0][2]
    assert body["method"] == "asha" and body["metric"] == "loss"
    assert body["max_resource"] == 27 and body["reduction_factor"] == 3
    assert "metric" not in body["template"], "sweep settings are not task fields"
    sweep.info["metric"], sweep.info["mode"] = "loss", "min"
    assert sweep.best()["params"] == {"lr": 0.01}
    sweep.info["items"][1]["stopped_early"] = "stopped early by ASHA: ..."
    assert sweep.best()["params"] == {"lr": 0.1}, "a stopped trial did not run its budget"
    assert [r["trial"] for r in sweep.stopped_early] == [1]
    sweep.info["metric"] = None
    with pytest.raises(autodl.ValidationError):
        sweep.best()
