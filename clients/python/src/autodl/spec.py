"""Turning the configurations users write into the server's ``TaskSpec``.

Users write task configurations the way the autodl articles show them (``task_name``,
``checkpoint_path``, ``gpu_type``, ...) or as native ``TaskSpec`` dicts (docs/tasks-api.md).
This module maps the former onto the latter and leaves everything it does not know untouched,
so the server, which rejects unknown fields, stays the single judge of what is valid and its
message reaches the user unchanged.
"""

from __future__ import annotations

import copy
import datetime as _dt
import os
from typing import (
    Any,
    Dict,
    Iterable,
    List,
    Mapping,
    MutableMapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)

from .errors import ValidationError

SHELL = "/bin/sh"

# Seed-style key -> path of the TaskSpec field it stands for.
ALIASES: Dict[str, Tuple[str, ...]] = {
    "task_name": ("name",),
    "checkpoint_path": ("checkpoint", "save_to"),
    "checkpoint_interval": ("checkpoint", "interval"),
    "gpu_type": ("resources", "gpu", "type"),
    "gpu_count": ("resources", "gpu", "count"),
    "gpu_memory": ("resources", "gpu", "memory"),
    "cpu": ("resources", "cpu"),
    "cpus": ("resources", "cpu"),
    "memory": ("resources", "memory"),
    "max_retries": ("retry_policy", "max_retries"),
    "oom_recovery": ("retry_policy", "oom_recovery"),
}


def shell_command(commands: Union[str, Sequence[str]]) -> List[str]:
    """Several shell commands become one ``/bin/sh -c "a && b"`` so a failing step stops the
    task (rather than running the next step on a broken state)."""
    if isinstance(commands, str):
        commands = [commands]
    parts = [str(c).strip() for c in commands if str(c).strip()]
    if not parts:
        raise ValidationError("commands must hold at least one non-empty command", field="commands")
    return [SHELL, "-c", " && ".join(parts)]


def deep_merge(
    base: MutableMapping[str, Any], extra: Mapping[str, Any]
) -> MutableMapping[str, Any]:
    """Merges ``extra`` into ``base`` in place, recursing into nested dicts (``extra`` wins)."""
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(base.get(key), MutableMapping):
            deep_merge(base[key], value)
        else:
            base[key] = copy.deepcopy(value) if isinstance(value, (dict, list)) else value
    return base


def iso_datetime(value: Union[str, _dt.datetime, _dt.date]) -> str:
    """An ISO 8601 string for the server: datetimes are written in UTC with ``Z`` (naive ones
    are taken as UTC, as the server does), strings pass through after a syntax check."""
    if isinstance(value, _dt.datetime):
        if value.tzinfo is not None:
            value = value.astimezone(_dt.timezone.utc).replace(tzinfo=None)
        return value.isoformat(timespec="seconds") + "Z"
    if isinstance(value, _dt.date):
        return _dt.datetime(value.year, value.month, value.day).isoformat(timespec="seconds") + "Z"
    if isinstance(value, str):
        parse_iso_datetime(value)
        return value
    raise ValidationError(
        f"deadline must be an ISO 8601 string or a datetime, not {type(value).__name__}",
        field="deadline",
    )


def parse_iso_datetime(text: str, field: str = "deadline") -> _dt.datetime:
    """Parses the ISO 8601 forms the server accepts (``2024-03-20T18:00``, ``...:00Z``, with
    an offset), on every supported Python (3.9's ``fromisoformat`` rejects ``Z``)."""
    raw = text.strip()
    candidate = raw[:-1] + "+00:00" if raw.endswith(("Z", "z")) else raw
    try:
        parsed = _dt.datetime.fromisoformat(candidate)
    except ValueError:
        parsed = None
    if parsed is None or len(candidate) <= 10:  # a date alone has no time of day
        raise ValidationError(
            f"{field} must be an ISO 8601 date and time such as 2024-03-20T18:00, got {text!r}",
            field=field,
        )
    return parsed


#: A length of time: seconds, a ``timedelta``, or text the server reads (``"2h30m"``).
Span = Union[int, str, _dt.timedelta, None]


def span_value(value: Span, field: str) -> Union[int, str, None]:
    """A span as the server takes it (whole seconds or text), or a ValidationError naming
    ``field``; the server judges the text."""
    if value is None:
        return None
    if isinstance(value, _dt.timedelta):
        value = int(value.total_seconds())
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise ValidationError(
            f"{field} must be seconds, a timedelta or text such as '2h30m', got {value!r}",
            field=field,
        )
    if isinstance(value, int) and value <= 0 or isinstance(value, str) and not value.strip():
        raise ValidationError(
            f"{field} must be at least one second (e.g. '30m'), got {value!r}", field=field
        )
    return value


def _plain(value: Any) -> Any:
    """JSON-friendly form of the values users commonly put in configs (paths, datetimes)."""
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, _dt.timedelta):
        return int(value.total_seconds())
    if isinstance(value, (_dt.datetime, _dt.date)):
        return iso_datetime(value)
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _set_path(
    spec: MutableMapping[str, Any], path: Tuple[str, ...], value: Any, alias: str
) -> None:
    node = spec
    for key in path[:-1]:
        child = node.get(key)
        if child is None:
            child = node[key] = {}
        elif not isinstance(child, MutableMapping):
            raise ValidationError(
                f"{alias} sets {'.'.join(path)}, but {key} is not an object", field=alias
            )
        node = child
    last = path[-1]
    if last in node and node[last] != value:
        raise ValidationError(
            f"{alias}={value!r} contradicts {'.'.join(path)}={node[last]!r}; give only one",
            field=alias,
        )
    node[last] = value


def _stringify_env(env: Any) -> Any:
    """Environment values must be strings; numbers and paths are converted for convenience,
    anything else is left for the server to reject with its own message."""
    if not isinstance(env, Mapping):
        return env
    out: Dict[str, Any] = {}
    for key, value in env.items():
        if isinstance(value, bool):
            out[key] = value
        elif isinstance(value, (int, float, os.PathLike)):
            out[key] = os.fspath(value) if isinstance(value, os.PathLike) else str(value)
        else:
            out[key] = value
    return out


def worker_count(value: Any) -> Any:
    """``num_workers`` as the server reads it: a number, or for an elastic task that grows and
    shrinks between two widths ``{"min": 2, "max": 8}``, also written ``(2, 8)``, ``range(2, 9)``
    or ``"2-8"``. Anything else is left for the server to refuse with its own message."""
    if isinstance(value, range) and value.step == 1 and len(value) > 0:
        return {"min": value.start, "max": value.stop - 1}
    if isinstance(value, (tuple, list)) and len(value) == 2:
        return {"min": value[0], "max": value[1]}
    if isinstance(value, str):
        low, dash, high = value.partition("-")
        try:
            return {"min": int(low), "max": int(high)} if dash else int(value)
        except ValueError:
            return value
    return value


def build_spec(
    config: Optional[Mapping[str, Any]] = None,
    *,
    request: Any = None,
    **overrides: Any,
) -> Dict[str, Any]:
    """The ``TaskSpec`` dict for a seed-style or native configuration.

    ``overrides`` are merged over ``config``; ``request`` (a
    :class:`~autodl.scheduler.TaskRequest` or a plain dict fragment) is merged last, so an
    explicit scheduling request wins over values in a shared config file.
    """
    source: Dict[str, Any] = dict(config or {})
    source.update(overrides)
    if "commands" in source:
        if "command" in source:
            raise ValidationError("give either commands or command, not both", field="commands")
        source["command"] = shell_command(source.pop("commands"))

    spec: Dict[str, Any] = {}
    aliased = []
    for key, value in source.items():
        if key in ALIASES:
            aliased.append((key, value))
        else:
            spec[key] = _plain(value)
    for alias, value in aliased:
        if value is None:
            continue
        _set_path(spec, ALIASES[alias], _plain(value), alias)

    if "num_workers" in spec:
        spec["num_workers"] = worker_count(spec["num_workers"])
    if "env" in spec:
        spec["env"] = _stringify_env(spec["env"])
    if "after" in spec:
        # Tasks (or ids) this one starts after; a single one needs no list.
        after = spec["after"]
        items = after if isinstance(after, (list, tuple)) else [after]
        spec["after"] = [str(getattr(t, "id", t)) for t in items]
    if request is not None:
        fragment = request.to_spec() if hasattr(request, "to_spec") else request
        if not isinstance(fragment, Mapping):
            raise ValidationError("request must be a TaskRequest or a dict", field="request")
        deep_merge(spec, _plain(fragment))
    return {k: v for k, v in spec.items() if v is not None}


#: Top-level fields of the server's ``TaskSpec`` (docs/tasks-api.md), for did-you-mean hints.
SPEC_FIELDS = (
    "name",
    "image",
    "command",
    "entry_point",
    "env",
    "resources",
    "num_workers",
    "gpu_per_worker",
    "launcher",
    "priority",
    "deadline",
    "estimated_runtime",
    "time_limit",
    "rendezvous_timeout",
    "checkpoint",
    "retry_policy",
    "affinity",
    "data_path",
    "workdir",
    "code",
    "setup",
    "requirements",
    "labels",
    "batch_size",
    "global_batch",
    "preemptible",
    "after",
    "after_when",
    "after_failure",
    "kind",
    "ports",
)


#: Names other tools use for a key of ours, where spelling alone would suggest the wrong one
#: (``gpus`` is closer to ``cpus`` than to ``gpu_count``).
SYNONYMS = {
    "gpus": "gpu_count",
    "gpu": "gpu_count",
    "num_gpus": "gpu_count",
    "n_gpus": "gpu_count",
    "gpu_num": "gpu_count",
    "accelerators": "gpu_type",
    "workers": "num_workers",
    "nodes": "num_workers",
    "mem": "memory",
    "ram": "memory",
    "cmd": "command",
    "script": "entry_point",
    "docker_image": "image",
    "container": "image",
    "environment": "env",
    "envs": "env",
    "tags": "labels",
    "requirements_txt": "requirements",
    "pip_requirements": "requirements",
    "setup_commands": "setup",
    "retries": "max_retries",
    "timeout": "time_limit",
    "depends_on": "after",
    "dependencies": "after",
    "max_runtime": "time_limit",
    "walltime": "time_limit",
    "working_dir": "workdir",
    "code_dir": "workdir",
    "cwd": "workdir",
}


# The keys of the spec's nested objects, by where they sit: a typo deep in the spec is
# matched against its neighbours (``resources.gpu.cont`` means ``count``, not ``gpu_count``).
NESTED_FIELDS = {
    "resources": ("gpu", "cpu", "memory"),
    "resources.gpu": ("type", "count", "memory"),
    "checkpoint": ("interval", "save_to", "keep"),
    "retry_policy": ("max_retries", "oom_recovery"),
    "affinity": ("zone", "bandwidth"),
}


def in_users_terms(
    exc: ValidationError, config: Optional[Mapping[str, Any]], overrides: Mapping[str, Any]
) -> ValidationError:
    """A server refusal of a spec built from ``config``, told with the keys the user wrote:
    ``resources.gpu.count`` becomes ``gpu_count`` when that is what they set, and an unknown
    key gets a did-you-mean among the keys this SDK and the server know."""
    import difflib

    field = exc.field
    if not field:
        return exc
    written = set(config or {}) | set(overrides)
    message, shown = exc.message, field
    by_path = {".".join(path): alias for alias, path in ALIASES.items() if alias in written}
    if field in by_path:
        shown = by_path[field]
        message = f"{shown} (sent as {field}): {message}"
    elif "not a field" in message:
        parent, _, unknown = field.rpartition(".")
        known = (
            sorted(NESTED_FIELDS.get(parent, ()))
            if parent
            else sorted(set(ALIASES) | set(SPEC_FIELDS) | {"commands"})
        )
        close = (SYNONYMS.get(unknown.lower()) if not parent else None) or next(
            iter(difflib.get_close_matches(unknown, known, n=1, cutoff=0.6)), None
        )
        if close:
            message = f"{message}; did you mean {close!r}?"
    else:
        return exc
    return type(exc)(message, status=exc.status, code=exc.code, field=shown)


def label_params(label: Any) -> Iterable[str]:
    """``label`` filter values as ``key=value`` strings from a string, a dict or a list."""
    if label is None:
        return []
    if isinstance(label, str):
        return [label]
    if isinstance(label, Mapping):
        return [f"{k}={v}" for k, v in label.items()]
    if isinstance(label, tuple) and len(label) == 2 and all(isinstance(x, str) for x in label):
        return [f"{label[0]}={label[1]}"]
    return [str(x) if isinstance(x, str) else f"{x[0]}={x[1]}" for x in label]
