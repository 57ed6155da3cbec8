"""Packing a task's workdir: what is left out, stable ids, size limits, uploads skipped."""

from __future__ import annotations

import io
import json
import os
import tarfile

import httpx
import pytest

import autodl
from autodl.workdir import bundle_id, collect, pack


def make_project(root):
    (root / "src" / "__pycache__").mkdir(parents=True)
    (root / "data" / "raw").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / "train.py").write_text("print('hi')\n")
    (root / "run.sh").write_text("#!/bin/sh\n")
    os.chmod(root / "run.sh", 0o755)
    (root / "src" / "model.py").write_text("x = 1\n")
    (root / "src" / "__pycache__" / "model.cpython-311.pyc").write_bytes(b"\0")
    (root / "src" / "notes.log").write_text("log\n")
    (root / "data" / "raw" / "big.bin").write_bytes(b"1" * 100)
    (root / ".git" / "HEAD").write_text("ref\n")
    (root / ".gitignore").write_text("*.log\n")
    (root / ".autodlignore").write_text("data/\n")
    (root / "src" / ".gitignore").write_text("model.py\n!model.py\n")


def test_ignore_files_git_and_caches_are_left_out(tmp_path):
    make_project(tmp_path)
    os.symlink("/etc/passwd", tmp_path / "passwd")
    with pytest.warns(UserWarning, match="links are not packed: passwd"):
        names = [rel for rel, _ in collect(tmp_path)]
    assert names == [
        ".autodlignore",
        ".gitignore",
        "run.sh",
        "src/.gitignore",
        "src/model.py",
        "train.py",
    ]


def test_the_bundle_is_the_same_for_the_same_files_and_keeps_modes(tmp_path):
    make_project(tmp_path)
    a = pack(tmp_path)
    os.utime(tmp_path / "train.py", (1, 1))
    b = pack(tmp_path)
    assert a.id == b.id == bundle_id(a.data) and a.id.startswith("sha256:")
    with tarfile.open(fileobj=io.BytesIO(a.data), mode="r:gz") as tar:
        modes = {m.name: m.mode for m in tar.getmembers()}
    assert modes["run.sh"] == 0o755 and modes["train.py"] == 0o644
    (tmp_path / "train.py").write_text("print('changed')\n")
    assert pack(tmp_path).id != a.id


def test_too_big_names_the_largest_entries(tmp_path):
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "w.bin").write_bytes(os.urandom(50_000))
    (tmp_path / "train.py").write_text("print(1)\n")
    with pytest.raises(autodl.ValidationError) as err:
        pack(tmp_path, max_bytes=10_000)
    assert err.value.field == "workdir"
    assert "weights/ (0.1 MB)" in err.value.message and ".autodlignore" in err.value.message


def test_an_archive_is_sent_as_is_and_a_missing_folder_is_refused(tmp_path):
    archive = tmp_path / "code.zip"
    archive.write_bytes(b"PK\x03\x04 not really")
    assert pack(archive).data == archive.read_bytes()
    with pytest.raises(autodl.ValidationError) as err:
        pack(tmp_path / "missing")
    assert err.value.field == "workdir"


def test_submit_uploads_only_what_the_server_lacks(tmp_path):
    make_project(tmp_path)
    bundle = pack(tmp_path)
    stored = set()
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path))
        if request.method == "GET" and request.url.path.startswith("/api/v1/code/"):
            cid = request.url.path.rsplit("/", 1)[1]
            if cid in stored:
                return httpx.Response(200, json={"id": cid, "size_bytes": 1, "stored": False})
            return httpx.Response(404, json={"error": {"code": "not_found", "message": "no"}})
        if request.method == "POST" and request.url.path == "/api/v1/code":
            cid = bundle_id(request.content)
            stored.add(cid)
            return httpx.Response(
                201, json={"id": cid, "size_bytes": len(request.content), "stored": True}
            )
        body = json.loads(request.content)
        assert "workdir" not in body
        return httpx.Response(201, json={"id": "t1", "state": "pending", "spec": body})

    client = autodl.Client(api_key="k", base_url="http://x", transport=httpx.MockTransport(handler))
    first = client.submit_task(
        {"name": "n", "image": "i", "entry_point": "train.py", "workdir": tmp_path}
    )
    assert first.info["spec"]["code"] == bundle.id
    client.submit_task(
        {"name": "n", "image": "i", "entry_point": "train.py"}, workdir=str(tmp_path)
    )
    assert [m for m, p in seen if p == "/api/v1/code"] == ["POST"], seen


def test_an_unchanged_folder_is_not_packed_again(tmp_path, monkeypatch):
    import autodl.client

    project = tmp_path / "project"
    project.mkdir()
    (project / "train.py").write_text("print(1)\n")
    stored = set()
    seen = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append((request.method, request.url.path))
        if request.method == "GET":
            cid = request.url.path.rsplit("/", 1)[1]
            if cid in stored:
                return httpx.Response(200, json={"id": cid, "size_bytes": 7, "stored": False})
            return httpx.Response(404, json={"error": {"code": "not_found", "message": "no"}})
        cid = bundle_id(request.content)
        stored.add(cid)
        return httpx.Response(201, json={"id": cid, "size_bytes": 7, "stored": True})

    client = autodl.Client(api_key="k", base_url="http://x", transport=httpx.MockTransport(handler))
    first = client.upload_code(project)
    assert first["uploaded"] is True
    with monkeypatch.context() as m:
        m.setattr(autodl.client, "pack", lambda *a, **k: pytest.fail("packed again"))
        seen.clear()
        again = client.upload_code(project)
    assert again == {"id": first["id"], "size_bytes": 7, "uploaded": False}
    assert seen == [("GET", f"/api/v1/code/{first['id']}")]
    # A changed file is packed and sent; a bundle the server lost is sent again.
    (project / "train.py").write_text("print(22)\n")
    changed = client.upload_code(project)
    assert changed["uploaded"] is True and changed["id"] != first["id"]
    stored.clear()
    assert client.upload_code(project)["uploaded"] is True


def test_an_entry_point_in_the_submitting_folder_ships_that_folder(tmp_path, monkeypatch, capsys):
    (tmp_path / "train.py").write_text("print(1)\n")
    monkeypatch.chdir(tmp_path)
    sent = []

    def handler(request: httpx.Request) -> httpx.Response:
        if request.method == "GET" and request.url.path.startswith("/api/v1/code/"):
            return httpx.Response(404, json={"error": {"code": "not_found", "message": "no"}})
        if request.method == "POST" and request.url.path == "/api/v1/code":
            return httpx.Response(
                201,
                json={"id": bundle_id(request.content), "size_bytes": 2_500_000, "stored": True},
            )
        body = json.loads(request.content)
        sent.append(body)
        return httpx.Response(201, json={"id": "t1", "state": "pending", "spec": body})

    client = autodl.Client(api_key="k", base_url="http://x", transport=httpx.MockTransport(handler))
    client.submit_task({"name": "n", "image": "i", "entry_point": "train.py --epochs 3"})
    assert sent[-1]["code"].startswith("sha256:"), sent
    said = capsys.readouterr().err
    assert "train.py --epochs 3" in said and str(tmp_path) in said and "2.5 MB" in said, said
    # A script that is not here is the image's; a task with code of its own keeps it.
    client.submit_task({"name": "n", "image": "i", "entry_point": "elsewhere.py"})
    assert "code" not in sent[-1], sent
    client.submit_task({"name": "n", "image": "i", "entry_point": "train.py", "code": "sha256:x"})
    assert sent[-1]["code"] == "sha256:x", sent
