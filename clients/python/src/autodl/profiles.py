"""Saved servers and keys: what ``autodl login`` writes and what ``Client()`` falls back to.

One INI file of profiles (``[default]``, ``[lab]``, ...), each with ``api_url`` and
``api_key``. The file holds secrets, so it is written readable by its owner only, and
replaced whole (a crash never leaves half a file). Environment variables win over it, so a
task (which the platform gives ``AUTODL_API_URL`` and a token) never reads a user's file.

Where: ``$AUTODL_CONFIG``, else ``$XDG_CONFIG_HOME/autodl/config``, else
``~/.config/autodl/config``. Which profile: ``$AUTODL_PROFILE``, else ``default``.
"""

from __future__ import annotations

import configparser
import io
import os
from pathlib import Path
from typing import Dict, Optional

from .checkpoint import write_atomic

CONFIG_ENV = "AUTODL_CONFIG"
PROFILE_ENV = "AUTODL_PROFILE"
DEFAULT_PROFILE = "default"


def config_path() -> Path:
    explicit = os.environ.get(CONFIG_ENV)
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "autodl" / "config"


def profile_name(name: Optional[str] = None) -> str:
    return name or os.environ.get(PROFILE_ENV) or DEFAULT_PROFILE


def _read() -> configparser.ConfigParser:
    parser = configparser.ConfigParser(interpolation=None)
    path = config_path()
    try:
        parser.read_string(path.read_text(encoding="utf-8"), source=str(path))
    except FileNotFoundError:
        pass
    except (OSError, configparser.Error):
        # An unreadable or broken file must not stop a client that has its settings from
        # arguments or the environment; `autodl login` rewrites it.
        return configparser.ConfigParser(interpolation=None)
    return parser


def load_profile(name: Optional[str] = None) -> Dict[str, str]:
    """The settings of a profile (empty when there is no such file or profile)."""
    parser = _read()
    section = profile_name(name)
    return dict(parser[section]) if parser.has_section(section) else {}


def profiles() -> Dict[str, Dict[str, str]]:
    parser = _read()
    return {s: dict(parser[s]) for s in parser.sections()}


def save_profile(api_url: str, api_key: str, name: Optional[str] = None) -> Path:
    """Stores a profile (others are kept); returns the file's path."""
    parser = _read()
    section = profile_name(name)
    if not parser.has_section(section):
        parser.add_section(section)
    parser[section]["api_url"] = api_url
    parser[section]["api_key"] = api_key
    text = io.StringIO()
    parser.write(text)
    # Through a temporary file, which is made readable by its owner only.
    return write_atomic(config_path(), lambda fh: fh.write(text.getvalue().encode("utf-8")))
