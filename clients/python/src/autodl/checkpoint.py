"""Checkpoints from inside a task.

Write your checkpoint files into :func:`directory` (``AUTODL_CHECKPOINT_DIR``); the node agent
uploads that folder every ``checkpoint.interval`` seconds, when the task stops (preemption,
cancel, node drain: on SIGTERM, within the grace period) and whenever you call
:func:`save_now`. A later attempt starts with the newest complete upload already in the folder
and ``autodl.env.is_restored`` true::

    import autodl, torch

    ckpt = autodl.checkpoint.directory() / "model.pt"
    start = 0
    if autodl.env.is_restored:
        state = torch.load(ckpt)
        start = state["step"] + 1
    for step in range(start, steps):
        ...
        if step % 500 == 0:
            autodl.checkpoint.write_atomic(ckpt, lambda f: torch.save({"step": step, ...}, f))
            autodl.checkpoint.save_now(step=step)
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import IO, Callable, Dict, Optional

#: The file the agent watches; its content names the step and epoch of the checkpoint.
MARKER = ".autodl-save"


def directory() -> Path:
    """The checkpoint folder (``AUTODL_CHECKPOINT_DIR``; ``./checkpoints`` outside a task),
    created if needed."""
    path = Path(os.environ.get("AUTODL_CHECKPOINT_DIR") or "checkpoints")
    path.mkdir(parents=True, exist_ok=True)
    return path


def restore_path() -> Optional[Path]:
    """The folder holding the checkpoint this attempt resumes from, or ``None`` on a fresh
    start."""
    if os.environ.get("AUTODL_IS_RESTORED", "").strip() != "1":
        return None
    p = os.environ.get("AUTODL_RESTORE_PATH")
    return Path(p) if p else None


def write_atomic(path: os.PathLike[str] | str, write: Callable[[IO[bytes]], object]) -> Path:
    """Writes a file through a temporary name and renames it into place, so an upload (or a
    crash) never sees half a checkpoint."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".autodl-tmp-", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            write(fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return target


def save_now(step: Optional[int] = None, epoch: Optional[float] = None) -> Path:
    """Asks the agent to upload the checkpoint folder now, recording ``step`` and ``epoch``
    with it. Returns immediately; the upload happens in the background (within a second)."""
    info: Dict[str, float] = {}
    if step is not None:
        info["step"] = int(step)
    if epoch is not None:
        info["epoch"] = float(epoch)
    folder = directory()
    return write_atomic(folder / MARKER, lambda f: f.write(json.dumps(info).encode()))
