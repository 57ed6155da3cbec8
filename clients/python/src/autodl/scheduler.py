"""Scheduling requests: what a task asks of the scheduler (hardware, priority, deadline).

A :class:`TaskRequest` is validated when it is made, so a typo in a deadline fails in the
notebook cell that wrote it rather than minutes later at submission; the server still checks
everything again.
"""

from __future__ import annotations

import datetime as _dt
import numbers
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Union

from .errors import ValidationError
from .spec import Span, iso_datetime, parse_iso_datetime, span_value

GpuType = Union[str, List[str], None]


@dataclass
class TaskRequest:
    """Hardware and urgency a task asks for.

    ``gpu_type`` is a type (``"A100-40G"``) or family (``"A100"``), or a list of acceptable
    ones; ``priority`` is in [0, 1] (default 0.5); ``deadline`` is ISO 8601 or a datetime (no
    offset means UTC); ``estimated_runtime`` lets the scheduler judge how urgent the deadline
    is, and ``time_limit`` stops a run that lasts longer (it ends ``TIMED_OUT``): both are
    seconds, a ``timedelta`` or text such as ``"2h30m"``. :meth:`to_spec` gives the
    ``TaskSpec`` fragment merged into a submission.
    """

    gpu_type: GpuType = None
    priority: float = 0.5
    deadline: Union[str, _dt.datetime, None] = None
    estimated_runtime: Span = None
    gpu_count: Optional[int] = None
    gpu_memory: Union[int, str, None] = None
    preemptible: Optional[bool] = None
    time_limit: Span = None

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raises :class:`~autodl.errors.ValidationError` for values the server would refuse."""
        p = self.priority
        if isinstance(p, bool) or not isinstance(p, numbers.Real) or not (0.0 <= float(p) <= 1.0):
            raise ValidationError(
                f"priority must be a number between 0 and 1, got {p!r}", field="priority"
            )
        if self.gpu_type is not None:
            types = [self.gpu_type] if isinstance(self.gpu_type, str) else self.gpu_type
            if (
                not isinstance(types, (list, tuple))
                or not types
                or not all(isinstance(t, str) and t.strip() for t in types)
            ):
                raise ValidationError(
                    "gpu_type must be a GPU type name or a non-empty list of them", field="gpu_type"
                )
        if self.deadline is not None:
            if isinstance(self.deadline, str):
                parse_iso_datetime(self.deadline)
            elif not isinstance(self.deadline, _dt.datetime):
                raise ValidationError(
                    "deadline must be an ISO 8601 string such as 2024-03-20T18:00 or a datetime",
                    field="deadline",
                )
        span_value(self.estimated_runtime, "estimated_runtime")
        span_value(self.time_limit, "time_limit")
        if self.gpu_count is not None and (
            isinstance(self.gpu_count, bool)
            or not isinstance(self.gpu_count, int)
            or not 0 <= self.gpu_count <= 64
        ):
            raise ValidationError(
                "gpu_count must be an integer between 0 and 64", field="gpu_count"
            )

    @property
    def deadline_datetime(self) -> Optional[_dt.datetime]:
        """The deadline as an aware UTC datetime (naive input is read as UTC)."""
        if self.deadline is None:
            return None
        parsed = (
            parse_iso_datetime(self.deadline) if isinstance(self.deadline, str) else self.deadline
        )
        if parsed.tzinfo is None:
            parsed = parsed.replace(tzinfo=_dt.timezone.utc)
        return parsed.astimezone(_dt.timezone.utc)

    def to_spec(self) -> Dict[str, Any]:
        """The ``TaskSpec`` fragment for this request (only the fields it sets)."""
        self.validate()
        spec: Dict[str, Any] = {"priority": float(self.priority)}
        gpu: Dict[str, Any] = {}
        if self.gpu_type is not None:
            gpu["type"] = self.gpu_type if isinstance(self.gpu_type, str) else list(self.gpu_type)
        if self.gpu_count is not None:
            gpu["count"] = self.gpu_count
        if self.gpu_memory is not None:
            gpu["memory"] = self.gpu_memory
        if gpu:
            spec["resources"] = {"gpu": gpu}
        if self.deadline is not None:
            spec["deadline"] = iso_datetime(self.deadline)
        if self.estimated_runtime is not None:
            spec["estimated_runtime"] = span_value(self.estimated_runtime, "estimated_runtime")
        if self.time_limit is not None:
            spec["time_limit"] = span_value(self.time_limit, "time_limit")
        if self.preemptible is not None:
            spec["preemptible"] = bool(self.preemptible)
        return spec


__all__ = ["TaskRequest"]
