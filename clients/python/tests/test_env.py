"""autodl.env reads the task environment at access time; autodl.report posts metrics."""

import json

import httpx
import pytest

import autodl
from autodl import reporting
from autodl._http import HttpClient

VARS = [
    "AUTODL_TASK_ID",
    "AUTODL_ATTEMPT",
    "AUTODL_IS_RESTORED",
    "AUTODL_RESTORE_PATH",
    "AUTODL_BATCH_SIZE",
    "AUTODL_CHECKPOINT_DIR",
    "AUTODL_RESULTS_DIR",
    "AUTODL_TASK_TOKEN",
    "AUTODL_API_KEY",
]


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for name in VARS:
        monkeypatch.delenv(name, raising=False)


def test_outside_a_task():
    env = autodl.env
    assert env.task_id is None and env.in_task is False
    assert env.is_restored is False and env.restore_path is None
    assert env.attempt == 1 and env.batch_size is None
    assert env.checkpoint_dir is None and env.results_dir is None


def test_values_are_read_at_access_time(monkeypatch):
    assert autodl.env.is_restored is False
    monkeypatch.setenv("AUTODL_IS_RESTORED", "1")
    monkeypatch.setenv("AUTODL_RESTORE_PATH", "/ckpt/step-300")
    monkeypatch.setenv("AUTODL_TASK_ID", "t-1")
    monkeypatch.setenv("AUTODL_ATTEMPT", "2")
    monkeypatch.setenv("AUTODL_BATCH_SIZE", "32")
    monkeypatch.setenv("AUTODL_CHECKPOINT_DIR", "/ckpt")
    monkeypatch.setenv("AUTODL_RESULTS_DIR", "/results")
    env = autodl.env
    assert env.is_restored is True
    assert env.restore_path == "/ckpt/step-300"
    assert env.task_id == "t-1" and env.in_task
    assert env.attempt == 2 and env.batch_size == 32
    assert env.checkpoint_dir == "/ckpt" and env.results_dir == "/results"
    assert env.current.as_dict()["batch_size"] == 32
    monkeypatch.setenv("AUTODL_IS_RESTORED", "0")
    assert env.is_restored is False


def test_bad_numbers_read_as_unset(monkeypatch):
    monkeypatch.setenv("AUTODL_BATCH_SIZE", "lots")
    monkeypatch.setenv("AUTODL_ATTEMPT", "-3")
    assert autodl.env.batch_size is None and autodl.env.attempt == 1


def test_unknown_attribute_raises():
    with pytest.raises(AttributeError):
        autodl.env.nope  # noqa: B018
    assert "is_restored" in dir(autodl.env)


def test_report_outside_a_task_warns_and_sends_nothing(monkeypatch):
    monkeypatch.setattr(reporting, "_warned_outside", False)
    monkeypatch.setattr(reporting, "_http_for", lambda *a: pytest.fail("must not connect"))
    with pytest.warns(RuntimeWarning, match="not running inside an autodl task"):
        assert autodl.report(epoch=1, loss=0.5) is False


class Recorder:
    def __init__(self, status=204, body=None):
        self.requests = []
        self.status = status
        self.body = body

    def __call__(self, request: httpx.Request) -> httpx.Response:
        self.requests.append(request)
        if self.body is None:
            return httpx.Response(self.status)
        return httpx.Response(self.status, json=self.body)


def _patch_http(monkeypatch, recorder):
    made = {}

    def fake(url, token):
        made["url"], made["token"] = url, token
        return HttpClient(url, token, transport=httpx.MockTransport(recorder))

    monkeypatch.setattr(reporting, "_http_for", fake)
    return made


def test_report_posts_numbers_with_the_task_token(monkeypatch):
    rec = Recorder()
    made = _patch_http(monkeypatch, rec)
    monkeypatch.setenv("AUTODL_TASK_ID", "t-9")
    monkeypatch.setenv("AUTODL_API_URL", "http://srv:1234")
    monkeypatch.setenv("AUTODL_API_KEY", "adl_user")
    monkeypatch.setenv("AUTODL_TASK_TOKEN", "tok_task")

    class Scalar:  # what a 0-d tensor or numpy scalar looks like
        def item(self):
            return 0.75

    assert autodl.report(epoch=3, loss=0.2, accuracy=Scalar(), step=None) is True
    (req,) = rec.requests
    assert req.method == "POST"
    assert str(req.url) == "http://srv:1234/api/v1/tasks/t-9/metrics"
    assert req.headers["authorization"] == "Bearer tok_task"
    assert json.loads(req.content) == {"epoch": 3, "loss": 0.2, "accuracy": 0.75}
    assert made["token"] == "tok_task"


def test_report_falls_back_to_the_api_key_and_drops_non_finite(monkeypatch):
    rec = Recorder()
    made = _patch_http(monkeypatch, rec)
    monkeypatch.setenv("AUTODL_TASK_ID", "t-9")
    monkeypatch.setenv("AUTODL_API_KEY", "adl_user")
    with pytest.warns(RuntimeWarning, match="non-finite"):
        autodl.report(epoch=1, loss=float("nan"))
    assert made["token"] == "adl_user"
    assert json.loads(rec.requests[0].content) == {"epoch": 1}


def test_report_of_text_warns_and_training_goes_on(monkeypatch):
    rec = Recorder()
    _patch_http(monkeypatch, rec)
    monkeypatch.setenv("AUTODL_TASK_ID", "t-9")
    monkeypatch.setenv("AUTODL_API_KEY", "adl_user")
    with pytest.warns(RuntimeWarning, match="note='x' is not a number"):
        assert autodl.report(epoch=2, note="x") is True
    assert json.loads(rec.requests[0].content) == {"epoch": 2}
    # Nothing numeric left: nothing is sent, and still no exception.
    with pytest.warns(RuntimeWarning):
        assert autodl.report(note="only text") is False
    assert len(rec.requests) == 1
    with pytest.raises(TypeError):
        autodl.report(note="x", strict=True)


def test_report_failure_warns_unless_strict(monkeypatch):
    rec = Recorder(
        400,
        {
            "error": {
                "code": "validation",
                "message": "gpu_util is measured by the platform",
                "field": "metrics",
            }
        },
    )
    _patch_http(monkeypatch, rec)
    monkeypatch.setenv("AUTODL_TASK_ID", "t-9")
    with pytest.warns(RuntimeWarning, match="gpu_util is measured by the platform"):
        assert autodl.report(gpu_util=0.5) is False
    with pytest.raises(autodl.ValidationError, match="measured by the platform"):
        autodl.report(gpu_util=0.5, strict=True)


def test_report_raises_for_non_numbers_only_when_strict(monkeypatch):
    _patch_http(monkeypatch, Recorder())
    monkeypatch.setenv("AUTODL_TASK_ID", "t-9")
    with pytest.raises(TypeError):
        autodl.report(note="hello", strict=True)
    with pytest.raises(TypeError):
        autodl.report(flag=True, strict=True)
    with pytest.warns(RuntimeWarning, match="flag=True is not a number"):
        assert autodl.report(flag=True) is False
