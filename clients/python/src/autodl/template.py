"""Reusable task definitions built in code, with chainable policy setters."""

from __future__ import annotations

import copy
import os
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional, Sequence, Union

from .errors import ValidationError
from .spec import build_spec, deep_merge, shell_command

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client
    from .scheduler import TaskRequest
    from .task import Task

DEFAULT_IMAGE = "pytorch/pytorch:latest"


def default_image() -> str:
    """The container image used when a template names none: ``AUTODL_DEFAULT_IMAGE`` or the
    official PyTorch image (the server requires an image; the articles often omit it)."""
    return os.environ.get("AUTODL_DEFAULT_IMAGE") or DEFAULT_IMAGE


class TaskTemplate:
    """A task definition that can be adjusted and submitted (possibly many times).

    ``commands`` (several shell commands, run in order, stopping at the first failure) or
    ``command`` / ``entry_point`` say what to run; ``resources``, ``checkpoint``, ``env`` and
    any other keyword follow the ``TaskSpec`` of the API (article-style keys such as
    ``gpu_type`` or ``checkpoint_path`` are accepted too).
    """

    def __init__(
        self,
        name: str,
        commands: Union[str, Sequence[str], None] = None,
        *,
        command: Union[str, Sequence[str], None] = None,
        entry_point: Optional[str] = None,
        image: Optional[str] = None,
        resources: Optional[Mapping[str, Any]] = None,
        checkpoint: Optional[Mapping[str, Any]] = None,
        env: Optional[Mapping[str, Any]] = None,
        labels: Optional[Mapping[str, str]] = None,
        **fields: Any,
    ) -> None:
        self.name = name
        self.commands: Optional[List[str]] = (
            [commands] if isinstance(commands, str) else list(commands) if commands else None
        )
        self.command = command
        self.entry_point = entry_point
        self.image = image
        self.resources: Dict[str, Any] = copy.deepcopy(dict(resources or {}))
        self.checkpoint: Dict[str, Any] = dict(checkpoint or {})
        self.env: Dict[str, Any] = dict(env or {})
        self.labels: Dict[str, str] = dict(labels or {})
        self.fields: Dict[str, Any] = dict(fields)
        self.retry_policy: Dict[str, Any] = dict(self.fields.pop("retry_policy", None) or {})
        self.affinity: Dict[str, Any] = dict(self.fields.pop("affinity", None) or {})
        self.request: Optional[TaskRequest] = None

    def __repr__(self) -> str:
        return f"TaskTemplate(name={self.name!r})"

    def set_retry_policy(self, max_retries: int = 3, oom_recovery: bool = False) -> TaskTemplate:
        """Retries a failed attempt up to ``max_retries`` times; with ``oom_recovery`` an
        out-of-memory attempt is retried with the batch size halved
        (``AUTODL_BATCH_SIZE``)."""
        self.retry_policy = {"max_retries": max_retries, "oom_recovery": bool(oom_recovery)}
        return self

    def set_affinity(self, zone: str = "any", bandwidth: str = "normal") -> TaskTemplate:
        """``zone="same"`` keeps all workers in one zone; ``bandwidth="high"`` prefers nodes
        on fast networks (cross-zone gradient exchange is what makes gangs slow)."""
        self.affinity = {"zone": zone, "bandwidth": bandwidth}
        return self

    def set_checkpoint(
        self, interval: Union[int, str, None] = None, save_to: Optional[str] = None
    ) -> TaskTemplate:
        """Checkpoint every ``interval`` (seconds, or text such as ``"10m"``) into ``save_to``
        (``s3://...`` or a path)."""
        if interval is not None:
            self.checkpoint["interval"] = interval
        if save_to is not None:
            self.checkpoint["save_to"] = save_to
        return self

    def set_request(self, request: TaskRequest) -> TaskTemplate:
        """Applies a scheduling request (GPU type, priority, deadline) on submission; it wins
        over the same fields set elsewhere in the template."""
        self.request = request
        return self

    def to_spec(self) -> Dict[str, Any]:
        """The ``TaskSpec`` dict this template submits."""
        config: Dict[str, Any] = {"name": self.name, "image": self.image or default_image()}
        if self.commands and self.command is not None:
            raise ValidationError("give either commands or command, not both", field="commands")
        if self.commands:
            config["command"] = shell_command(self.commands)
        if self.command is not None:
            config["command"] = self.command
        if self.entry_point is not None:
            config["entry_point"] = self.entry_point
        for key in ("resources", "checkpoint", "env", "labels", "retry_policy", "affinity"):
            value = getattr(self, key)
            if value:
                config[key] = copy.deepcopy(value)
        spec = build_spec(config, **copy.deepcopy(self.fields))
        if self.request is not None:
            deep_merge(spec, self.request.to_spec())
        return spec

    def submit(
        self,
        client: Optional[Client] = None,
        *,
        idempotency_key: Optional[str] = None,
    ) -> str:
        """Submits the template and returns the new task's id (as the articles use it with
        :func:`autodl.get_monitor`). ``client=None`` uses one configured from the
        environment."""
        if client is not None:
            return self.submit_task(client, idempotency_key=idempotency_key).id
        from .client import Client

        with Client() as own:
            return self.submit_task(own, idempotency_key=idempotency_key).id

    def submit_task(
        self, client: Optional[Client] = None, *, idempotency_key: Optional[str] = None
    ) -> Task:
        """Like :meth:`submit` but returns the :class:`~autodl.task.Task` handle."""
        from .client import Client

        if client is None:
            client = Client()
        return client.submit_spec(self.to_spec(), idempotency_key=idempotency_key)
