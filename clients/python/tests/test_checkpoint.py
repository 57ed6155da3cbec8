"""autodl.checkpoint: the files the agent looks for, written safely."""

import json

import autodl


def test_save_now_leaves_the_marker_the_agent_reads(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTODL_CHECKPOINT_DIR", str(tmp_path / "ckpt"))
    marker = autodl.checkpoint.save_now(step=12, epoch=3)
    assert marker == tmp_path / "ckpt" / ".autodl-save"
    assert json.loads(marker.read_text()) == {"step": 12, "epoch": 3.0}
    # Nothing else is left behind (the temporary file is renamed into place).
    assert [p.name for p in (tmp_path / "ckpt").iterdir()] == [".autodl-save"]


def test_write_atomic_replaces_whole_files_only(tmp_path):
    target = tmp_path / "a" / "model.bin"
    autodl.checkpoint.write_atomic(target, lambda f: f.write(b"v1"))
    assert target.read_bytes() == b"v1"

    def broken(f):
        f.write(b"half")
        raise RuntimeError("disk full")

    try:
        autodl.checkpoint.write_atomic(target, broken)
    except RuntimeError:
        pass
    assert target.read_bytes() == b"v1", "a failed write keeps the previous checkpoint"
    assert sorted(p.name for p in target.parent.iterdir()) == ["model.bin"]


def test_restore_path_only_when_restored(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTODL_RESTORE_PATH", str(tmp_path))
    monkeypatch.setenv("AUTODL_IS_RESTORED", "0")
    assert autodl.checkpoint.restore_path() is None
    monkeypatch.setenv("AUTODL_IS_RESTORED", "1")
    assert autodl.checkpoint.restore_path() == tmp_path


def test_directory_outside_a_task(tmp_path, monkeypatch):
    monkeypatch.delenv("AUTODL_CHECKPOINT_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    assert autodl.checkpoint.directory().resolve() == (tmp_path / "checkpoints").resolve()
