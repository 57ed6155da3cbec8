"""Sweeps: one submission that makes a task per trial of a parameter grid or random search,
optionally stopping the trials behind early (ASHA).

``${name}`` in the template's command, env or name is replaced by each trial's value. The
server makes every trial in one request (all of them or none), runs at most
``max_concurrency`` at once, and cancels them as one.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Union

from .errors import TaskTimeout, ValidationError
from .task import Task

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

#: Trial states that will not change any more.
FINISHED = ("completed", "failed", "cancelled", "timed_out")

#: A parameter's values: a list, or for a random sweep a range
#: ``{"min": 1e-5, "max": 1e-1, "log": True}`` (``"integer": True`` for whole numbers).
Values = Union[Sequence[Any], Mapping[str, Any]]


def parameters_body(parameters: Mapping[str, Values]) -> Dict[str, Any]:
    if not isinstance(parameters, Mapping) or not parameters:
        raise ValidationError(
            "parameters maps each name to its values, e.g. {'lr': [0.1, 0.01]}",
            field="parameters",
        )
    out: Dict[str, Any] = {}
    for name, values in parameters.items():
        if isinstance(values, Mapping):
            out[name] = dict(values)
        elif isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise ValidationError(
                f"parameters.{name} is a list of values or a range "
                "{'min': ..., 'max': ..., 'log': True}",
                field="parameters",
            )
        else:
            out[name] = list(values)
    return out


class Sweep:
    """A sweep as the server shows it: ``id``, ``name``, ``trials``, ``states`` (trials per
    state) and, from :meth:`refresh` or :meth:`Client.get_sweep`, ``rows``: each trial's
    ``params``, ``state``, ``task_id`` and newest ``metrics``."""

    def __init__(self, client: Client, info: Mapping[str, Any]) -> None:
        self._client = client
        self.info: Dict[str, Any] = dict(info)

    def __repr__(self) -> str:
        return f"<autodl.Sweep {self.id} {self.name!r} {self.trials} trials>"

    @property
    def id(self) -> str:
        return str(self.info["id"])

    @property
    def name(self) -> str:
        return str(self.info.get("name", ""))

    @property
    def trials(self) -> int:
        return int(self.info.get("trials", 0))

    @property
    def states(self) -> Dict[str, int]:
        return dict(self.info.get("states") or {})

    @property
    def rows(self) -> List[Dict[str, Any]]:
        return list(self.info.get("items") or [])

    @property
    def done(self) -> bool:
        return sum(n for s, n in self.states.items() if s in FINISHED) >= self.trials

    def refresh(self) -> Sweep:
        self.info = self._client._http.get(f"/sweeps/{self.id}")
        return self

    def tasks(self) -> List[Task]:
        """The trials' tasks, in trial order."""
        return [self._client.task(r["task_id"]) for r in self.refresh().rows]

    def cancel(self) -> int:
        """Cancels every trial that has not ended; returns how many."""
        body = self._client._http.post(f"/sweeps/{self.id}/cancel")
        return int(body.get("cancelled", 0))

    def wait(self, timeout: Optional[float] = None, poll: float = 2.0) -> Dict[str, int]:
        """Blocks until every trial ended; returns the trials per state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not self.refresh().done:
            if deadline is not None and time.monotonic() >= deadline:
                raise TaskTimeout(f"sweep {self.id} still running after {timeout} s")
            time.sleep(poll)
        return self.states

    @property
    def metric(self) -> Optional[str]:
        """What the sweep optimises, when it named it."""
        return self.info.get("metric")

    @property
    def stopped_early(self) -> List[Dict[str, Any]]:
        """The trials ASHA stopped early (each row's ``stopped_early`` says why)."""
        return [r for r in self.rows if r.get("stopped_early")]

    def best(
        self, metric: Optional[str] = None, mode: Optional[str] = None
    ) -> Optional[Dict[str, Any]]:
        """The completed trial with the lowest (``mode="max"``: highest) newest ``metric``;
        by default the metric and mode the sweep was submitted with. Trials stopped early
        never count: they did not run their budget."""
        metric = metric or self.metric
        mode = mode or self.info.get("mode") or "min"
        if not metric:
            raise ValidationError(
                "name the metric: best('val_loss'), or submit the sweep with metric=...",
                field="metric",
            )
        if mode not in ("min", "max"):
            raise ValidationError("mode is 'min' or 'max'", field="mode")
        scored = [
            r
            for r in self.rows
            if r.get("state") == "completed"
            and not r.get("stopped_early")
            and isinstance(r["metrics"].get(metric), (int, float))
        ]
        if not scored:
            return None
        pick = min if mode == "min" else max
        return pick(scored, key=lambda r: r["metrics"][metric])
