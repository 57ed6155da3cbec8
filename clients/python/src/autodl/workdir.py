"""Packing the folder a task runs in (``workdir``) into a code bundle.

The bundle is a ``.tar.gz`` that is byte-for-byte the same for the same files (sorted names,
no timestamps or owners), so its SHA-256 names it: the server keeps one copy per
organization and an unchanged folder is not uploaded again. What ``.gitignore`` files and an
``.autodlignore`` (same syntax) exclude is left out, as are ``.git/``, ``__pycache__/`` and
links (a link could point at anything on your machine).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import stat
import tarfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple, Union

import pathspec

from .errors import ValidationError

#: What the server accepts by default (its ``code_max_bytes``), packed.
MAX_BUNDLE_BYTES = 200 * 1000 * 1000
IGNORE_FILES = (".gitignore", ".autodlignore")
ALWAYS_SKIPPED = (".git", "__pycache__", ".hg", ".svn")
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".zip")


@dataclass
class Bundle:
    """A packed folder: its bytes, id (``sha256:...``) and what it holds."""

    data: bytes
    id: str
    files: List[str] = field(default_factory=list)
    unpacked_bytes: int = 0

    @property
    def size(self) -> int:
        return len(self.data)


def bundle_id(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _specs_for(directory: Path, rel: str) -> List[Tuple[str, pathspec.GitIgnoreSpec]]:
    found: List[Tuple[str, pathspec.GitIgnoreSpec]] = []
    for name in IGNORE_FILES:
        path = directory / name
        if path.is_file():
            lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
            found.append((rel, pathspec.GitIgnoreSpec.from_lines(lines)))
    return found


def _ignored(rel: str, is_dir: bool, specs: List[Tuple[str, pathspec.GitIgnoreSpec]]) -> bool:
    """Whether any ignore file above ``rel`` (a ``/`` path from the root) excludes it; each
    file's patterns are relative to its own folder, as git reads them."""
    for base, spec in specs:
        inner = rel[len(base) + 1 :] if base else rel
        if spec.match_file(inner + "/" if is_dir else inner):
            return True
    return False


def collect(root: Union[str, os.PathLike[str]]) -> List[Tuple[str, Path]]:
    """The ``(relative name, path)`` of every file the bundle of ``root`` holds, sorted."""
    base = Path(root)
    specs_by_dir: Dict[str, List[Tuple[str, pathspec.GitIgnoreSpec]]] = {}
    out: List[Tuple[str, Path]] = []
    skipped_links: List[str] = []
    for dirpath, dirnames, filenames in os.walk(base, followlinks=False):
        here = Path(dirpath)
        rel_dir = here.relative_to(base).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir
        parent = rel_dir.rpartition("/")[0] if rel_dir else None
        inherited = specs_by_dir.get(parent, []) if parent is not None else []
        specs = inherited + _specs_for(here, rel_dir)
        specs_by_dir[rel_dir] = specs
        kept_dirs = []
        for d in sorted(dirnames):
            rel = f"{rel_dir}/{d}" if rel_dir else d
            if d in ALWAYS_SKIPPED or _ignored(rel, True, specs):
                continue
            if (here / d).is_symlink():
                skipped_links.append(rel)
                continue
            kept_dirs.append(d)
        dirnames[:] = kept_dirs
        for f in sorted(filenames):
            rel = f"{rel_dir}/{f}" if rel_dir else f
            path = here / f
            if f.endswith(".pyc") or _ignored(rel, False, specs):
                continue
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                skipped_links.append(rel)
                continue
            if stat.S_ISREG(mode):
                out.append((rel, path))
    if skipped_links:
        shown = ", ".join(skipped_links[:5]) + (" ..." if len(skipped_links) > 5 else "")
        warnings.warn(f"workdir: links are not packed: {shown}", stacklevel=3)
    return sorted(out)


def _largest(files: List[Tuple[str, Path]], n: int = 5) -> str:
    """The biggest top-level entries, to say what to leave out."""
    sizes: Dict[str, int] = {}
    for rel, path in files:
        top = rel.split("/")[0] + ("/" if "/" in rel else "")
        sizes[top] = sizes.get(top, 0) + path.stat().st_size
    biggest = sorted(sizes.items(), key=lambda kv: -kv[1])[:n]
    return ", ".join(f"{name} ({size / 1e6:.1f} MB)" for name, size in biggest)


def fingerprint(files: List[Tuple[str, Path]]) -> str:
    """What the folder's files look like without reading them: names, sizes, modification
    times and the executable bit (as git's index judges a file unchanged). Equal
    fingerprints let an unchanged folder skip packing."""
    h = hashlib.sha256(b"autodl-workdir-v1\0")
    for rel, path in files:
        st = path.stat()
        executable = 1 if st.st_mode & 0o111 else 0
        h.update(f"{rel}\0{st.st_size}\0{st.st_mtime_ns}\0{executable}\n".encode())
    return h.hexdigest()


def _cache_file() -> Path:
    base = os.environ.get("AUTODL_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"),
        "autodl",
    )
    return Path(base) / "workdirs.json"


#: Folders remembered (the newest); each entry is a fingerprint and a bundle id.
_CACHE_ENTRIES = 64


def cached_bundle(fp: str) -> Optional[str]:
    """The bundle id a folder with this fingerprint packed to last time, if remembered."""
    try:
        entries = json.loads(_cache_file().read_text())
    except (OSError, ValueError):
        return None
    value = entries.get(fp) if isinstance(entries, dict) else None
    return value if isinstance(value, str) and value.startswith("sha256:") else None


def remember_bundle(fp: str, bundle: str) -> None:
    """Notes what this folder packed to; a cache that cannot be written is skipped."""
    path = _cache_file()
    try:
        entries = json.loads(path.read_text())
        if not isinstance(entries, dict):
            entries = {}
    except (OSError, ValueError):
        entries = {}
    entries.pop(fp, None)
    entries[fp] = bundle
    kept = dict(list(entries.items())[-_CACHE_ENTRIES:])
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(kept))
        os.replace(tmp, path)
    except OSError:
        pass


def pack(
    root: Union[str, os.PathLike[str]],
    max_bytes: int = MAX_BUNDLE_BYTES,
    files: Optional[List[Tuple[str, Path]]] = None,
) -> Bundle:
    """Packs ``root`` (a folder, or an existing ``.tar.gz``/``.tar``/``.zip`` sent as is);
    ``files`` is what :func:`collect` found in it, when already known."""
    path = Path(root)
    if path.is_file() and path.name.endswith(ARCHIVE_SUFFIXES):
        data = path.read_bytes()
        if len(data) > max_bytes:
            raise ValidationError(
                f"workdir: {path} is {len(data) / 1e6:.1f} MB, over the "
                f"{max_bytes / 1e6:.0f} MB a code bundle may be",
                field="workdir",
            )
        return Bundle(data=data, id=bundle_id(data))
    if not path.is_dir():
        raise ValidationError(
            f"workdir: {os.fspath(path)!r} is not a folder (or a .tar.gz/.zip of one); "
            "name the folder your training code is in, e.g. workdir='.'",
            field="workdir",
        )
    if files is None:
        files = collect(path)
    raw = sum(p.stat().st_size for _, p in files)
    buf = io.BytesIO()
    # The gzip header's timestamp is zero, so equal files give equal bytes and ids.
    with gzip.GzipFile(fileobj=buf, mode="wb", compresslevel=6, mtime=0) as gz:
        with tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
            for rel, file in files:
                info = tarfile.TarInfo(rel)
                st = file.stat()
                info.size = st.st_size
                info.mode = 0o755 if st.st_mode & 0o111 else 0o644
                info.mtime = 0
                with open(file, "rb") as fh:
                    tar.addfile(info, fh)
                if buf.tell() > max_bytes:
                    break
    data = buf.getvalue()
    if len(data) > max_bytes:
        raise ValidationError(
            f"workdir: {os.fspath(path)} packs to more than {max_bytes / 1e6:.0f} MB "
            f"({raw / 1e6:.1f} MB of files); the largest: {_largest(files)}. Leave data, "
            "checkpoints and outputs out with a .autodlignore (gitignore syntax) and read "
            "data through data_path",
            field="workdir",
        )
    return Bundle(
        data=data, id=bundle_id(data), files=[rel for rel, _ in files], unpacked_bytes=raw
    )
