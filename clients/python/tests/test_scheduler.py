"""TaskRequest: the scheduling request of the articles, validated where it is written."""

import datetime as dt

import pytest

import autodl
from autodl.scheduler import TaskRequest


def test_seed_request():
    req = TaskRequest(gpu_type="A100-40G", priority=0.8, deadline="2024-03-20T18:00")
    assert req.to_spec() == {
        "priority": 0.8,
        "deadline": "2024-03-20T18:00",
        "resources": {"gpu": {"type": "A100-40G"}},
    }
    assert req.deadline_datetime == dt.datetime(2024, 3, 20, 18, 0, tzinfo=dt.timezone.utc)


def test_defaults():
    assert TaskRequest().to_spec() == {"priority": 0.5}


@pytest.mark.parametrize("priority", [-0.1, 1.01, "high", None, True, float("nan")])
def test_priority_must_be_in_unit_interval(priority):
    with pytest.raises(autodl.ValidationError) as exc:
        TaskRequest(priority=priority)
    assert exc.value.field == "priority"
    assert isinstance(exc.value, ValueError)


@pytest.mark.parametrize("priority", [0, 0.0, 1, 0.5])
def test_priority_bounds_are_inclusive(priority):
    assert TaskRequest(priority=priority).to_spec()["priority"] == float(priority)


@pytest.mark.parametrize(
    "deadline",
    ["2024-03-20T18:00", "2024-03-20T18:00:00Z", "2024-03-20T18:00:00+08:00", "2024-03-20 18:00"],
)
def test_iso_deadlines_are_accepted(deadline):
    TaskRequest(deadline=deadline)


@pytest.mark.parametrize(
    "deadline", ["tomorrow", "2024-03-20", "20/03/2024 18:00", "2024-13-01T00:00", 1710957600]
)
def test_bad_deadlines_are_refused(deadline):
    with pytest.raises(autodl.ValidationError) as exc:
        TaskRequest(deadline=deadline)
    assert exc.value.field == "deadline"


def test_datetime_deadline_is_sent_in_utc():
    local = dt.datetime(2024, 3, 20, 18, 0, tzinfo=dt.timezone(dt.timedelta(hours=8)))
    assert TaskRequest(deadline=local).to_spec()["deadline"] == "2024-03-20T10:00:00Z"
    assert (
        TaskRequest(deadline=dt.datetime(2024, 3, 20, 18, 0)).to_spec()["deadline"]
        == "2024-03-20T18:00:00Z"
    )


def test_other_fields():
    req = TaskRequest(
        gpu_type=["A100", "A40"],
        gpu_count=2,
        gpu_memory="20GiB",
        estimated_runtime=3600,
        preemptible=False,
    )
    assert req.to_spec() == {
        "priority": 0.5,
        "resources": {"gpu": {"type": ["A100", "A40"], "count": 2, "memory": "20GiB"}},
        "estimated_runtime": 3600,
        "preemptible": False,
    }
    for bad in ({"gpu_type": ""}, {"gpu_type": []}, {"estimated_runtime": 0}, {"gpu_count": 65}):
        with pytest.raises(autodl.ValidationError):
            TaskRequest(**bad)


def test_mutation_is_revalidated_on_use():
    req = TaskRequest()
    req.priority = 3
    with pytest.raises(autodl.ValidationError):
        req.to_spec()


def test_spans_are_seconds_timedeltas_or_text():
    req = TaskRequest(estimated_runtime=dt.timedelta(hours=2), time_limit="2h30m")
    spec = req.to_spec()
    assert spec["estimated_runtime"] == 7200 and spec["time_limit"] == "2h30m"
    assert TaskRequest(time_limit=600).to_spec()["time_limit"] == 600
    for bad in (0, -5, "", True, 1.5):
        with pytest.raises(autodl.ValidationError) as exc:
            TaskRequest(time_limit=bad)
        assert exc.value.field == "time_limit"
