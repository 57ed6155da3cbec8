"""Mapping the configurations of the articles (and native specs) onto the server's TaskSpec."""

import datetime as dt
from pathlib import Path

import pytest

import autodl
from autodl import TaskTemplate
from autodl.scheduler import TaskRequest
from autodl.spec import build_spec, label_params, shell_command

SEED_CONFIG = {
    "task_name": "distributed_mnist",
    "num_workers": 4,
    "gpu_per_worker": 1,
    "image": "pytorch/pytorch:latest",
    "entry_point": "train.py",
    "data_path": "/data/mnist",
    "checkpoint_path": "/checkpoints",
}


def test_seed_config_maps_to_task_spec():
    assert build_spec(SEED_CONFIG) == {
        "name": "distributed_mnist",
        "num_workers": 4,
        "gpu_per_worker": 1,
        "image": "pytorch/pytorch:latest",
        "entry_point": "train.py",
        "data_path": "/data/mnist",
        "checkpoint": {"save_to": "/checkpoints"},
    }


def test_seed_scheduler_keys_map_into_resources_and_policies():
    spec = build_spec(
        {
            "task_name": "t",
            "image": "img",
            "command": "python x.py",
            "gpu_type": "A100-40G",
            "gpu_memory": "20GiB",
            "cpu": 8,
            "memory": "32GiB",
            "priority": 0.8,
            "deadline": "2024-03-20T18:00",
            "checkpoint_interval": 600,
            "max_retries": 3,
            "oom_recovery": True,
        }
    )
    assert spec["resources"] == {
        "gpu": {"type": "A100-40G", "memory": "20GiB"},
        "cpu": 8,
        "memory": "32GiB",
    }
    assert spec["checkpoint"] == {"interval": 600}
    assert spec["retry_policy"] == {"max_retries": 3, "oom_recovery": True}
    assert spec["priority"] == 0.8 and spec["deadline"] == "2024-03-20T18:00"


def test_native_spec_passes_through_untouched():
    native = {
        "name": "n",
        "image": "i",
        "command": ["python", "a.py"],
        "resources": {"gpu": {"type": ["A100", "A40"], "count": 2}},
        "labels": {"team": "vision"},
        "preemptible": False,
    }
    assert build_spec(native) == native


def test_unknown_keys_are_left_for_the_server_to_judge():
    assert build_spec({"name": "n", "image": "i", "gpus": 3})["gpus"] == 3


def test_alias_and_native_field_must_agree():
    with pytest.raises(autodl.ValidationError) as exc:
        build_spec({"task_name": "a", "name": "b", "image": "i"})
    assert exc.value.field == "task_name" and exc.value.status is None
    # equal values are fine
    assert build_spec({"task_name": "a", "name": "a"})["name"] == "a"


def test_alias_merges_into_existing_nested_object():
    spec = build_spec({"resources": {"gpu": {"count": 2}}, "gpu_type": "A40"})
    assert spec["resources"] == {"gpu": {"count": 2, "type": "A40"}}


def test_commands_become_one_shell_command():
    assert shell_command(["pip install -r req.txt", "python train.py --lr 1e-4"]) == [
        "/bin/sh",
        "-c",
        "pip install -r req.txt && python train.py --lr 1e-4",
    ]
    assert build_spec({"commands": "echo hi"})["command"] == ["/bin/sh", "-c", "echo hi"]
    with pytest.raises(autodl.ValidationError):
        shell_command(["  "])
    with pytest.raises(autodl.ValidationError):
        build_spec({"commands": ["a"], "command": "b"})


def test_values_are_made_json_friendly():
    spec = build_spec(
        {
            "checkpoint_path": Path("/ckpt"),
            "deadline": dt.datetime(2024, 3, 20, 18, 0, tzinfo=dt.timezone(dt.timedelta(hours=8))),
            "env": {"EPOCHS": 10, "LR": 0.1, "NAME": "x"},
        }
    )
    assert spec["checkpoint"] == {"save_to": "/ckpt"}
    assert spec["deadline"] == "2024-03-20T10:00:00Z"
    assert spec["env"] == {"EPOCHS": "10", "LR": "0.1", "NAME": "x"}


def test_request_fragment_wins_over_config():
    req = TaskRequest(gpu_type="A100-40G", priority=0.8, deadline="2024-03-20T18:00")
    spec = build_spec(
        {**SEED_CONFIG, "priority": 0.1, "resources": {"gpu": {"count": 2}}}, request=req
    )
    assert spec["priority"] == 0.8
    assert spec["resources"] == {"gpu": {"count": 2, "type": "A100-40G"}}
    assert spec["deadline"] == "2024-03-20T18:00"


def test_seed_template_to_spec():
    template = TaskTemplate(
        name="resnet50_finetune",
        commands=["python train.py --lr 1e-4"],
        resources={"gpu": {"type": "A100", "count": 2}, "cpu": 8, "memory": "32GiB"},
        checkpoint={"interval": 3600, "save_to": "s3://my-bucket/checkpoints"},
    )
    template.set_retry_policy(max_retries=3, oom_recovery=True)
    template.set_affinity(zone="same", bandwidth="high")
    assert template.to_spec() == {
        "name": "resnet50_finetune",
        "image": "pytorch/pytorch:latest",
        "command": ["/bin/sh", "-c", "python train.py --lr 1e-4"],
        "resources": {"gpu": {"type": "A100", "count": 2}, "cpu": 8, "memory": "32GiB"},
        "checkpoint": {"interval": 3600, "save_to": "s3://my-bucket/checkpoints"},
        "retry_policy": {"max_retries": 3, "oom_recovery": True},
        "affinity": {"zone": "same", "bandwidth": "high"},
    }


def test_template_default_image_from_env_and_extra_fields(monkeypatch):
    monkeypatch.setenv("AUTODL_DEFAULT_IMAGE", "registry.local/train:1")
    t = TaskTemplate(
        "x", entry_point="train.py", env={"A": "1"}, labels={"team": "nlp"}, batch_size=64
    )
    t.set_request(TaskRequest(gpu_type=["A40", "A100"], priority=0.9)).set_checkpoint(interval=60)
    spec = t.to_spec()
    assert spec["image"] == "registry.local/train:1"
    assert spec["entry_point"] == "train.py" and "command" not in spec
    assert (
        spec["batch_size"] == 64 and spec["labels"] == {"team": "nlp"} and spec["env"] == {"A": "1"}
    )
    assert spec["resources"] == {"gpu": {"type": ["A40", "A100"]}}
    assert spec["priority"] == 0.9 and spec["checkpoint"] == {"interval": 60}


def test_template_to_spec_does_not_mutate_the_template():
    t = TaskTemplate("x", commands=["a", "b"], resources={"gpu": {"count": 1}})
    t.set_request(TaskRequest(gpu_type="A40"))
    t.to_spec()
    assert t.resources == {"gpu": {"count": 1}}
    assert t.to_spec()["command"] == ["/bin/sh", "-c", "a && b"]


def test_label_params_forms():
    assert list(label_params("a=b")) == ["a=b"]
    assert list(label_params({"a": "b", "c": "d"})) == ["a=b", "c=d"]
    assert list(label_params(("a", "b"))) == ["a=b"]
    assert list(label_params(["a=b", ("c", "d")])) == ["a=b", "c=d"]
    assert list(label_params(None)) == []


def test_after_takes_tasks_or_ids():
    from autodl.spec import build_spec

    class FakeTask:
        id = "t-1"

    assert build_spec({"name": "n", "after": FakeTask()})["after"] == ["t-1"]
    assert build_spec({"name": "n", "after": [FakeTask(), "t-2"]})["after"] == ["t-1", "t-2"]


def test_num_workers_takes_an_elastic_range_in_several_spellings():
    for given in [(2, 8), [2, 8], range(2, 9), "2-8", {"min": 2, "max": 8}]:
        spec = build_spec({"name": "t", "image": "i", "num_workers": given})
        assert spec["num_workers"] == {"min": 2, "max": 8}, given
    assert build_spec({"name": "t", "image": "i", "num_workers": 4})["num_workers"] == 4
    # What it cannot read goes to the server, which says what is wrong.
    assert build_spec({"name": "t", "image": "i", "num_workers": "many"})["num_workers"] == "many"


@pytest.mark.parametrize(
    "field, suggested",
    [
        ("resources.gpu.cont", "count"),
        ("resources.cpus", "cpu"),
        ("checkpoint.intervall", "interval"),
        ("gpus", "gpu_count"),
        ("retries", "max_retries"),
    ],
)
def test_a_typo_is_matched_against_the_keys_beside_it(field, suggested):
    from autodl.spec import in_users_terms

    refused = autodl.ValidationError(
        f"{field} is not a field of this request", status=400, code="validation", field=field
    )
    told = in_users_terms(refused, {}, {})
    assert told.message.endswith(f"did you mean {suggested!r}?"), told.message
