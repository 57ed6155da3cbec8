"""Reporting training progress from inside a task (``autodl.report(epoch=3, loss=0.2)``).

Reporting must never break training: outside a task it is a no-op with a warning, and a
failed post warns instead of raising (pass ``strict=True`` to raise). Non-finite numbers
(a loss that became NaN) are dropped with a warning because JSON cannot carry them, and so
are values that are not numbers (``note="x"``: text belongs in the log).
"""

from __future__ import annotations

import math
import numbers
import os
import threading
import warnings
from typing import Any, Dict, Optional, Tuple

from ._http import HttpClient, env_api_url
from .errors import AutodlError

_lock = threading.Lock()
_cached: Optional[Tuple[Tuple[str, Optional[str]], HttpClient]] = None
_warned_outside = False


def _http_for(url: str, token: Optional[str]) -> HttpClient:
    """One connection pool per (server, token), reused across reports (they come every
    step or epoch)."""
    global _cached
    with _lock:
        if _cached is not None and _cached[0] == (url, token):
            return _cached[1]
        if _cached is not None:
            _cached[1].close()
        http = HttpClient(url, token, timeout=10.0)
        _cached = ((url, token), http)
        return http


def _numbers(values: Dict[str, Any], strict: bool = False) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for key, value in values.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real):
            # tensors and numpy scalars convert through float()/item()
            item = getattr(value, "item", None)
            if callable(item):
                try:
                    value = item()
                except (TypeError, ValueError):
                    pass  # a tensor of several values: refused below
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                message = (
                    f"autodl.report: {key}={value!r} is not a number and is not sent "
                    "(metrics are numbers; print text to the log instead)"
                )
                if strict:
                    raise TypeError(message)
                warnings.warn(message, RuntimeWarning, stacklevel=3)
                continue
        if isinstance(value, numbers.Integral):
            out[key] = int(value)
        elif math.isfinite(float(value)):
            out[key] = float(value)
        else:
            warnings.warn(
                f"autodl.report: dropping non-finite {key}={value!r}", RuntimeWarning, stacklevel=3
            )
    return out


def report(
    epoch: Optional[int] = None,
    loss: Optional[float] = None,
    step: Optional[int] = None,
    *,
    strict: bool = False,
    **values: Any,
) -> bool:
    """Posts metrics for the current task to ``POST /api/v1/tasks/{AUTODL_TASK_ID}/metrics``.

    Authenticates with ``AUTODL_TASK_TOKEN`` when set (what the platform gives tasks), else
    ``AUTODL_API_KEY``. Returns True when the server accepted the sample.
    """
    global _warned_outside
    task_id = os.environ.get("AUTODL_TASK_ID")
    if not task_id:
        if not _warned_outside:
            warnings.warn(
                "autodl.report: not running inside an autodl task (AUTODL_TASK_ID is unset); "
                "metrics are not sent",
                RuntimeWarning,
                stacklevel=2,
            )
            _warned_outside = True
        return False
    body = _numbers({"epoch": epoch, "loss": loss, "step": step, **values}, strict)
    if not body:
        return False
    token = os.environ.get("AUTODL_TASK_TOKEN") or os.environ.get("AUTODL_API_KEY") or None
    http = _http_for(env_api_url(), token)
    try:
        http.post(f"/tasks/{task_id}/metrics", body)
    except AutodlError as exc:
        if strict:
            raise
        warnings.warn(f"autodl.report: metrics not sent: {exc}", RuntimeWarning, stacklevel=2)
        return False
    return True
