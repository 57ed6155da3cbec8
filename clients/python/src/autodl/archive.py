"""Safe extraction of results archives.

A results archive is produced by user code running in a container, so it is untrusted: a
member named ``../../.bashrc`` or ``/etc/passwd``, or a link pointing outside, must never be
written. Every member is checked before anything is extracted, so a bad archive leaves the
target directory untouched.
"""

from __future__ import annotations

import os
import posixpath
import tarfile
from pathlib import Path
from typing import List, Union

from .errors import UnsafeArchive


def _is_within(root: str, target: str) -> bool:
    return os.path.commonpath([root, target]) == root


def _check_name(name: str) -> None:
    if not name or name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        raise UnsafeArchive(f"results archive member {name!r} has an absolute path")
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        raise UnsafeArchive(f"results archive member {name!r} climbs out with '..'")


def check_members(tar: tarfile.TarFile, dest: Union[str, Path]) -> List[tarfile.TarInfo]:
    """The archive's members after checking each lands inside ``dest``; raises
    :class:`~autodl.errors.UnsafeArchive` on absolute paths, ``..``, links leaving ``dest``,
    and device or FIFO entries."""
    root = os.path.realpath(os.fspath(dest))
    members = tar.getmembers()
    for m in members:
        _check_name(m.name)
        target = os.path.realpath(os.path.join(root, m.name))
        if not _is_within(root, target):
            raise UnsafeArchive(f"results archive member {m.name!r} would land outside {root}")
        if m.ischr() or m.isblk() or m.isfifo() or m.isdev():
            raise UnsafeArchive(f"results archive member {m.name!r} is a device or FIFO")
        if m.issym() or m.islnk():
            link = m.linkname
            if not link or link.startswith(("/", "\\")):
                raise UnsafeArchive(f"results archive link {m.name!r} points to an absolute path")
            if m.issym():
                base = posixpath.dirname(m.name)
                resolved = os.path.realpath(os.path.join(root, base, link))
            else:  # hard links name a member path relative to the archive root
                resolved = os.path.realpath(os.path.join(root, link))
            if not _is_within(root, resolved):
                raise UnsafeArchive(f"results archive link {m.name!r} points outside {root}")
    return members


def safe_extract(archive: Union[str, Path], dest: Union[str, Path]) -> Path:
    """Extracts a (possibly compressed) tar archive into ``dest`` after checking every
    member; returns ``dest``. Modes are sanitised (no set-uid bits, no foreign owners)."""
    dest_path = Path(dest)
    dest_path.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, mode="r:*") as tar:
        members = check_members(tar, dest_path)
        for m in members:
            m.mode &= 0o755 if m.isdir() else 0o644 | (m.mode & 0o111)
            m.uid = m.gid = os.getuid() if hasattr(os, "getuid") else 0
            m.uname = m.gname = ""
        if hasattr(tarfile, "data_filter"):
            # Python ships the PEP 706 filter: a second, independent line of defence.
            tar.extractall(dest_path, members=members, filter="data")
        else:  # pragma: no cover - older interpreters without PEP 706
            tar.extractall(dest_path, members=members)
    return dest_path
