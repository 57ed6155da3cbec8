"""No README escapes the examples test: each code block of each README in the repository is
run by ``test_readme_live.py``, compiled as a doctest of its crate, or marked as setup with
the reason it cannot run (a registration token, a GPU host, minutes of simulation)."""

from __future__ import annotations

import subprocess

from test_readme_live import REPO, RUN_AS_EXAMPLES, blocks


def readmes() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "*README.md"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout.split()
    # Outside a checkout (an unpacked source archive), the files on disk.
    return listed or [
        str(p.relative_to(REPO))
        for p in REPO.rglob("README.md")
        if not {"node_modules", "target", ".git"} & set(p.parts)
    ]


def doctested(readme: str) -> bool:
    """A crate's README compiled with its tests (``#[doc = include_str!("../README.md")]``)."""
    crate = (REPO / readme).parent
    lib = crate / "src" / "lib.rs"
    return lib.exists() and 'include_str!("../README.md")' in lib.read_text(encoding="utf-8")


def test_every_readme_block_is_run_compiled_or_marked_setup():
    found = readmes()
    assert "README.md" in found and "clients/python/README.md" in found, found
    loose = []
    for readme in found:
        for b in blocks(REPO / readme):
            if b.setup:
                continue
            if readme in RUN_AS_EXAMPLES and b.lang in ("python", "sh", "yaml"):
                continue
            if b.lang.startswith("rust") and doctested(readme):
                continue
            loose.append(f"{b.where} ({b.lang or 'no language'})")
    assert not loose, f"README blocks no test runs (run them, or mark them setup): {loose}"


def test_setup_blocks_say_why():
    for readme in readmes():
        text = (REPO / readme).read_text(encoding="utf-8")
        for line in text.splitlines():
            if line.startswith("<!-- setup:"):
                reason = line.removeprefix("<!-- setup:").removesuffix("-->").strip()
                assert len(reason) > 5, f"{readme}: a setup mark without its reason: {line}"
