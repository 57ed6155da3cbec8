"""Watching a running task: status and the latest metrics, in the units people read.

The articles print ``metrics.gpu_util`` with a ``%`` sign and memory in MB and compare
utilization with 60, so :meth:`Monitor.get_metrics` reports utilization in percent and memory
in MiB; the raw API values (a 0..1 fraction, bytes) stay available as ``gpu_util_fraction``,
``mem_used_bytes`` and ``mem_total_bytes``. For a task on several GPUs, ``gpu_util`` is their
mean and ``mem_used``/``mem_total`` their sums; ``gpus`` has each GPU's own values.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Union

from .task import Task

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client

MIB = 1024 * 1024

#: Fields always present in a :class:`Metrics` (None until the first sample carries them).
BASE_FIELDS = ("gpu_util", "mem_used", "mem_total")
#: Fields present once the training code reports them; attribute access gives None before.
REPORTED_FIELDS = ("epoch", "loss", "step")
#: Per-GPU values as the API names them (``gpu0_util``, ``gpu0_mem``).
_PER_GPU = re.compile(r"^gpu(\d+)_(util|mem)$")


class Metrics(Dict[str, Any]):
    """A dict of the latest metric values that also reads as attributes
    (``metrics.gpu_util`` and ``metrics["gpu_util"]``)."""

    def __getattr__(self, name: str) -> Any:
        try:
            return self[name]
        except KeyError:
            if name in BASE_FIELDS or name in REPORTED_FIELDS:
                return None
            raise AttributeError(f"no metric named {name!r}") from None


def _to_percent(value: Any) -> Any:
    """The API reports utilization as a 0..1 fraction."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return round(float(value) * 100.0, 2)
    return value


def _to_mib(value: Any) -> Any:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return round(value / MIB, 1)
    return value


class Monitor:
    """Live view of a task; every read of :attr:`status` and every :meth:`get_metrics` asks
    the server, so a polling loop sees fresh values."""

    def __init__(self, task: Task) -> None:
        self.task = task
        self._latest: Dict[str, Any] = {}
        self._values: Dict[str, Any] = {}
        self._gpus: Dict[int, Dict[str, Any]] = {}
        self._after: Optional[str] = None

    def __repr__(self) -> str:
        return f"<Monitor {self.task.id}>"

    @property
    def task_id(self) -> str:
        return self.task.id

    @property
    def status(self) -> str:
        """The task's current status (fetched on each read)."""
        return self.task.get_status()

    @property
    def finished(self) -> bool:
        """Whether the task has ended (COMPLETED, FAILED or CANCELLED), fetched now."""
        self.task.refresh()
        return self.task.finished

    def get_metrics(self) -> Metrics:
        """The latest value of each metric across the samples so far.

        Utilization and memory come from the node's GPU samples and ``epoch``/``loss`` (and
        any other reported numbers) from the training code's reports, which arrive as
        separate samples, so each field is the newest sample that carries it. Only new
        samples are fetched after the first call.
        """
        for sample in self.task.metrics(after=self._after):
            at = sample.get("at")
            if isinstance(at, str) and (self._after is None or at >= self._after):
                self._after = at
            for key, value in sample.items():
                if key in ("at", "values") or value is None:
                    continue
                self._latest[key] = value
            values = sample.get("values")
            if isinstance(values, dict):
                for key, value in values.items():
                    if value is None:
                        continue
                    per_gpu = _PER_GPU.match(key)
                    if per_gpu:
                        gpu = self._gpus.setdefault(int(per_gpu.group(1)), {})
                        gpu[per_gpu.group(2)] = value
                    else:
                        self._values[key] = value
        return self._build()

    def _build(self) -> Metrics:
        out = Metrics()
        out.update(self._values)
        out.update(self._latest)
        for key in ("epoch", "step"):
            # The API stores every reported number as a float; counters read better as ints.
            value = out.get(key)
            if isinstance(value, float) and value.is_integer():
                out[key] = int(value)
        raw_util = self._latest.get("gpu_util")
        raw_used = self._latest.get("mem_used")
        raw_total = self._latest.get("mem_total")
        out["gpu_util"] = _to_percent(raw_util)
        out["mem_used"] = _to_mib(raw_used)
        out["mem_total"] = _to_mib(raw_total)
        out["gpu_util_fraction"] = raw_util
        out["mem_used_bytes"] = raw_used
        out["mem_total_bytes"] = raw_total
        gpus: List[Dict[str, Any]] = []
        for index in sorted(self._gpus):
            g = self._gpus[index]
            gpus.append(
                {
                    "index": index,
                    "gpu_util": _to_percent(g.get("util")),
                    "mem_used": _to_mib(g.get("mem")),
                    "mem_used_bytes": g.get("mem"),
                }
            )
        out["gpus"] = gpus
        if self._after is not None:
            out["at"] = self._after
        return out


def get_monitor(task: Union[str, Task], client: Optional[Client] = None) -> Monitor:
    """A :class:`Monitor` for a task id (as returned by ``TaskTemplate.submit``) or handle.
    ``client=None`` uses the task's own client, else one configured from the environment."""
    if isinstance(task, Task):
        if client is not None and task._client is not client:
            task = Task(client, dict(task.info))
        return Monitor(task)
    if client is None:
        from .client import Client

        client = Client()
    return Monitor(client.task(str(task)))
