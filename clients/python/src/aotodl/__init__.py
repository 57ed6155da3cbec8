"""Alias of :mod:`autodl` under the spelling one of the platform's articles uses
(``import aotodl; aotodl.Client(...)``), so code copied from it runs unchanged."""

import sys as _sys

import autodl as _autodl
from autodl import *  # noqa: F401,F403
from autodl import __all__, __version__  # noqa: F401

env = _autodl.env
optim = _autodl.optim
scheduler = _autodl.scheduler

# ``from aotodl.scheduler import TaskRequest`` works too.
for _name in ("env", "optim", "scheduler"):
    _sys.modules[f"{__name__}.{_name}"] = getattr(_autodl, _name)
