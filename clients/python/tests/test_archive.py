"""Results archives are untrusted: nothing may be written outside the target directory."""

import io
import tarfile

import pytest

import autodl
from autodl.archive import safe_extract


def make_tar(path, members):
    """members: (name, bytes) files, or (name, TarInfo-type, linkname) links."""
    with tarfile.open(path, "w:gz") as tar:
        for entry in members:
            if len(entry) == 2:
                name, data = entry
                info = tarfile.TarInfo(name)
                info.size = len(data)
                info.mode = 0o4755  # set-uid must not survive
                tar.addfile(info, io.BytesIO(data))
            else:
                name, kind, link = entry
                info = tarfile.TarInfo(name)
                info.type = kind
                info.linkname = link
                tar.addfile(info)
    return path


def test_extracts_regular_files_and_dirs(tmp_path):
    archive = make_tar(
        tmp_path / "r.tar.gz", [("model/weights.bin", b"123"), ("metrics.json", b"{}")]
    )
    out = safe_extract(archive, tmp_path / "out")
    assert (out / "model" / "weights.bin").read_bytes() == b"123"
    assert (out / "metrics.json").read_text() == "{}"
    assert not (out / "metrics.json").stat().st_mode & 0o4000


@pytest.mark.parametrize(
    "members",
    [
        [("/etc/evil", b"x")],
        [("../evil", b"x")],
        [("ok/../../evil", b"x")],
        [("link", tarfile.SYMTYPE, "/etc/passwd")],
        [("link", tarfile.SYMTYPE, "../../outside")],
        [("hard", tarfile.LNKTYPE, "../outside")],
        [("dev", tarfile.CHRTYPE, "")],
    ],
    ids=[
        "absolute",
        "dotdot",
        "nested-dotdot",
        "abs-symlink",
        "escaping-symlink",
        "escaping-hardlink",
        "device",
    ],
)
def test_refuses_members_leaving_the_target(tmp_path, members):
    archive = make_tar(tmp_path / "bad.tar.gz", [("good.txt", b"fine")] + members)
    dest = tmp_path / "out"
    with pytest.raises(autodl.UnsafeArchive):
        safe_extract(archive, dest)
    # nothing at all was extracted, not even the good member before the bad one
    assert not (dest / "good.txt").exists()
    assert not (tmp_path / "evil").exists()


def test_symlink_inside_the_target_is_fine(tmp_path):
    archive = make_tar(
        tmp_path / "r.tar.gz", [("data/a.txt", b"a"), ("data/latest", tarfile.SYMTYPE, "a.txt")]
    )
    out = safe_extract(archive, tmp_path / "out")
    assert (out / "data" / "latest").read_text() == "a"
