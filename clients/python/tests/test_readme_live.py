"""Every example in the READMEs runs as written against the demo (``serve --demo``: simulated
GPUs, tasks run as local processes, as ``scripts/run.sh`` starts it).

A block after a ``<!-- setup: ... -->`` line (installing, starting servers, benchmarks) is an
instruction, not an example. A ``python`` or ``yaml`` block whose first line is ``# NAME`` is a
file the examples use: it is written into the folder first. The other blocks run in order in
one empty folder, ``python`` blocks in one interpreter session (as if pasted into one
``python``), ``sh`` blocks with ``bash -euo pipefail``. Only two things differ from a reader's
machine: the server's address (the demo listens on a free port, not 8080) and the sign-in
(``AUTODL_API_URL``/``AUTODL_API_KEY`` instead of ``autodl login``, which asks for a password).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List

import pytest
from conftest import LiveServer

pytestmark = pytest.mark.live

REPO = Path(__file__).resolve().parents[3]
FENCE = re.compile(r"^```([\w,-]*)\n(.*?)^```", re.S | re.M)
FILE_HEADER = re.compile(r"^# ([\w.-]+\.(?:py|ya?ml))\n")
README_ADDRESS = "http://127.0.0.1:8080"
# The READMEs whose examples run here (each has its test below); `test_readme_coverage.py`
# holds every other README to setup blocks or doctests.
RUN_AS_EXAMPLES = ("README.md", "clients/python/README.md")


@dataclass
class Block:
    where: str
    lang: str
    body: str
    setup: bool

    @property
    def file(self) -> str | None:
        m = FILE_HEADER.match(self.body)
        return m.group(1) if m and self.lang in ("python", "yaml") else None


def blocks(readme: Path) -> List[Block]:
    text = readme.read_text(encoding="utf-8")
    out = []
    for m in FENCE.finditer(text):
        before = text[: m.start()].rstrip().rsplit("\n", 1)[-1]
        line = text[: m.start()].count("\n") + 1
        out.append(
            Block(
                where=f"{readme.relative_to(REPO)}:{line}",
                lang=m.group(1),
                body=m.group(2),
                setup=before.startswith("<!-- setup:"),
            )
        )
    return out


def run_readme(readme: Path, demo: LiveServer, folder: Path, monkeypatch) -> Dict[str, Any]:
    """Runs the README's examples in ``folder``; returns the Python session's names."""
    all_blocks = blocks(readme)
    examples = [b for b in all_blocks if not b.setup]
    assert examples, f"{readme} has no examples"
    unknown = [b.where for b in examples if b.lang not in ("python", "sh", "yaml")]
    assert not unknown, f"blocks the test cannot run (mark setup ones): {unknown}"
    for b in examples:
        if b.file:
            (folder / b.file).write_text(b.body, encoding="utf-8")
    monkeypatch.chdir(folder)
    monkeypatch.setenv("AUTODL_API_URL", demo.url)
    monkeypatch.setenv("AUTODL_API_KEY", demo.api_key)
    env = dict(os.environ)
    # The `autodl` command of the SDK under test.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    session: Dict[str, Any] = {"__name__": "__readme__"}
    for b in examples:
        if b.file:
            continue
        body = b.body.replace(README_ADDRESS, demo.url)
        if b.lang == "python":
            exec(compile(body, b.where, "exec"), session)
        elif b.lang == "sh":
            done = subprocess.run(
                ["bash", "-euo", "pipefail", "-c", body],
                cwd=folder,
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, (
                f"{b.where} exited {done.returncode}\n--- stdout\n{done.stdout}\n"
                f"--- stderr\n{done.stderr}"
            )
            session.setdefault("__shell__", []).append(done.stdout)
        else:
            pytest.fail(f"{b.where}: a {b.lang} block that is not a file")
    return session


def test_the_sdk_readme_examples_run_as_written(demo: LiveServer, tmp_path, monkeypatch):
    ns = run_readme(REPO / "clients/python/README.md", demo, tmp_path, monkeypatch)
    # The first example's task ran the folder's train.py on its data and left results.
    assert ns["status"] == "COMPLETED", ns["task"].logs()
    assert (tmp_path / "output" / "summary.txt").read_text().startswith("loss 0.333 over 1000")
    assert ns["monitor"].status == "COMPLETED"
    assert ns["train_loader"].history, "AutoBatch evaluated the batch size"
    # The sweep found the learning rate train.py likes best; the search was cancelled whole.
    assert ns["best"]["params"] == {"lr": 0.01}, ns["sweep"].rows
    assert ns["search"].wait(timeout=60, poll=0.5) == {"cancelled": 20}
    # The code bundle left the data and the downloaded outputs out (.autodlignore): the folder
    # is unchanged as far as the platform is concerned, and nothing is uploaded again.
    again = ns["client"].upload_code(tmp_path)
    assert again["id"] == ns["task"].refresh().info["spec"]["code"] and not again["uploaded"]


def test_the_main_readme_examples_run_as_written(demo: LiveServer, tmp_path, monkeypatch):
    ns = run_readme(REPO / "README.md", demo, tmp_path, monkeypatch)
    (answer,) = ns["__shell__"]
    assert '"name":"resnet50"' in answer.replace(" ", ""), answer
