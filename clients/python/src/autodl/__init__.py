"""autodl: Python SDK for the autodl GPU training platform.

Quick start::

    import autodl

    client = autodl.Client(api_key="adl_...")        # or AUTODL_API_KEY / AUTODL_API_URL
    task = client.submit_task({"task_name": "mnist", "image": "pytorch/pytorch:latest",
                               "entry_point": "train.py", "gpu_per_worker": 1})
    print(task.wait())                                # "COMPLETED", "FAILED" or "CANCELLED"

Inside a task: ``autodl.env.is_restored``, ``autodl.checkpoint.save_now(step=...)``,
``autodl.report(epoch=1, loss=0.3)`` and ``autodl.optim.AutoBatch``.
"""

from . import checkpoint, env, optim, scheduler
from ._version import __version__
from .client import Client, default_client
from .errors import (
    AuthenticationError,
    AutodlConnectionError,
    AutodlError,
    Conflict,
    NotFound,
    PermissionDenied,
    QuotaExceeded,
    RateLimited,
    ServerError,
    TaskTimeout,
    UnsafeArchive,
    Unschedulable,
    ValidationError,
)
from .monitor import Metrics, Monitor, get_monitor
from .reporting import report
from .scheduler import TaskRequest
from .sweep import Sweep
from .task import FINAL_STATUSES, Task
from .template import TaskTemplate

__all__ = [
    "__version__",
    "Client",
    "default_client",
    "Task",
    "Sweep",
    "FINAL_STATUSES",
    "TaskTemplate",
    "TaskRequest",
    "Monitor",
    "Metrics",
    "get_monitor",
    "report",
    "env",
    "checkpoint",
    "optim",
    "scheduler",
    "AutodlError",
    "AuthenticationError",
    "AutodlConnectionError",
    "Conflict",
    "NotFound",
    "PermissionDenied",
    "QuotaExceeded",
    "RateLimited",
    "ServerError",
    "TaskTimeout",
    "Unschedulable",
    "UnsafeArchive",
    "ValidationError",
]
