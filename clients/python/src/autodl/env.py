"""What the platform tells a task through its environment, read at access time.

``autodl.env.is_restored`` and friends are module-level properties: each read looks at
``os.environ`` now (via :class:`TaskEnv`), so tests and launchers that set variables after
import see them, and a retried attempt never sees stale values.

| attribute | variable | type |
|---|---|---|
| ``task_id`` | ``AUTODL_TASK_ID`` | str or None |
| ``attempt`` | ``AUTODL_ATTEMPT`` | int (1 outside a task) |
| ``is_restored`` | ``AUTODL_IS_RESTORED`` == "1" | bool |
| ``restore_path`` | ``AUTODL_RESTORE_PATH`` | str or None |
| ``batch_size`` | ``AUTODL_BATCH_SIZE`` | int or None |
| ``checkpoint_dir`` | ``AUTODL_CHECKPOINT_DIR`` | str or None |
| ``results_dir`` | ``AUTODL_RESULTS_DIR`` | str or None |
| ``in_task`` | ``AUTODL_TASK_ID`` set | bool |
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional


def _int(name: str) -> Optional[int]:
    raw = os.environ.get(name, "").strip()
    if not raw:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


def _str(name: str) -> Optional[str]:
    value = os.environ.get(name)
    return value if value else None


class TaskEnv:
    """Accessors for the task environment; every property reads ``os.environ`` when used."""

    @property
    def task_id(self) -> Optional[str]:
        return _str("AUTODL_TASK_ID")

    @property
    def in_task(self) -> bool:
        """Whether this process runs as an autodl task."""
        return self.task_id is not None

    @property
    def attempt(self) -> int:
        """The attempt number, 1 for the first run (and outside a task)."""
        value = _int("AUTODL_ATTEMPT")
        return value if value is not None and value > 0 else 1

    @property
    def is_restored(self) -> bool:
        """Whether this attempt resumes from a checkpoint (after preemption or a retry)."""
        return os.environ.get("AUTODL_IS_RESTORED", "").strip() == "1"

    @property
    def restore_path(self) -> Optional[str]:
        """Where the checkpoint to resume from is, when :attr:`is_restored`."""
        return _str("AUTODL_RESTORE_PATH")

    @property
    def batch_size(self) -> Optional[int]:
        """The batch size the platform asks for (halved after an out-of-memory retry)."""
        value = _int("AUTODL_BATCH_SIZE")
        return value if value is not None and value > 0 else None

    @property
    def checkpoint_dir(self) -> Optional[str]:
        """Where to write checkpoints so a later attempt can resume from them."""
        return _str("AUTODL_CHECKPOINT_DIR")

    @property
    def results_dir(self) -> Optional[str]:
        """Where to write results; its content becomes the downloadable results archive."""
        return _str("AUTODL_RESULTS_DIR")

    def as_dict(self) -> Dict[str, Any]:
        return {name: getattr(self, name) for name in _NAMES}


_NAMES: List[str] = [
    "task_id",
    "in_task",
    "attempt",
    "is_restored",
    "restore_path",
    "batch_size",
    "checkpoint_dir",
    "results_dir",
]

current = TaskEnv()


def __getattr__(name: str) -> Any:
    """Module-level properties (PEP 562): ``autodl.env.is_restored`` reads the environment
    on every access."""
    if name in _NAMES:
        return getattr(current, name)
    raise AttributeError(f"module 'autodl.env' has no attribute {name!r}")


def __dir__() -> List[str]:
    return sorted(list(globals()) + _NAMES)
