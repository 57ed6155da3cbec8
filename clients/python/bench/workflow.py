"""A researcher's first-day operations, timed against a real server (``serve --demo``, the
debug build that ``scripts/run.sh`` serves): packing and uploading a 50 MB project folder
(``workdir``), submitting from it again unchanged, and a 200-trial sweep submitted and
cancelled. Each figure is the median of ``--runs`` runs; HTTP requests are counted.

    scripts/bench-workflow.sh            # builds the server, then runs this
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
from demo import demo_server

import autodl
from autodl.workdir import pack


class Counting(httpx.HTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.requests = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.requests += 1
        return super().handle_request(request)


def project(root: Path, megabytes: int) -> None:
    """A project folder: source files, configs, and binary assets (a vocabulary, small
    weights) that do not compress, ``megabytes`` in all."""
    rng = random.Random(7)
    (root / "src" / "models").mkdir(parents=True)
    (root / "configs").mkdir()
    (root / "assets").mkdir()
    words = "import torch def forward self return layer loss optimizer step batch".split()
    text_bytes = 0
    for i in range(300):
        body = "\n".join(" ".join(rng.choice(words) for _ in range(12)) for _ in range(400))
        (root / "src" / "models" / f"m{i}.py").write_text(body)
        text_bytes += len(body)
    for i in range(50):
        (root / "configs" / f"c{i}.yaml").write_text(f"lr: {rng.random()}\nlayers: {i}\n")
    left = megabytes * 1_000_000 - text_bytes
    for i in range(10):
        (root / "assets" / f"w{i}.bin").write_bytes(rng.randbytes(max(left // 10, 0)))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default=os.environ.get("AUTODL_SERVER_BIN"))
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--megabytes", type=int, default=50)
    ap.add_argument("--trials", type=int, default=200)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="autodl-bench-"))
    with demo_server(args.server, tmp) as (url, token):
        counting = Counting()
        client = autodl.Client(api_key=token, base_url=url, transport=counting, timeout=120)

        folder = tmp / "project"
        project(folder, args.megabytes)
        files = sum(1 for p in folder.rglob("*") if p.is_file())
        raw = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        packs, firsts, agains = [], [], []
        for run in range(args.runs):
            (folder / "src" / "run.txt").write_text(str(run))  # a new bundle each run
            t = time.perf_counter()
            bundle = pack(folder)
            packs.append(time.perf_counter() - t)
            t = time.perf_counter()
            first = client.upload_code(folder)
            firsts.append(time.perf_counter() - t)
            assert first["uploaded"], first
            before = counting.requests
            t = time.perf_counter()
            again = client.upload_code(folder)
            agains.append(time.perf_counter() - t)
            assert not again["uploaded"] and counting.requests - before == 1
        print(
            f"workdir: {files} files, {raw / 1e6:.1f} MB -> bundle {bundle.size / 1e6:.1f} MB; "
            f"pack {statistics.median(packs):.2f} s; "
            f"pack + upload {statistics.median(firsts):.2f} s (2 requests); "
            f"unchanged again {statistics.median(agains):.2f} s (1 request, nothing sent)"
        )

        template = {
            "name": "t-${i}",
            "image": "none",
            "command": "sleep 600 # ${i}",
            "resources": {"gpu": {"count": 1}},
        }
        submits, cancels = [], []
        for _ in range(args.runs):
            before = counting.requests
            t = time.perf_counter()
            sweep = client.submit_sweep(
                template, parameters={"i": list(range(args.trials))}, max_concurrency=4
            )
            submits.append(time.perf_counter() - t)
            sub_requests = counting.requests - before
            assert sweep.trials == args.trials
            before = counting.requests
            t = time.perf_counter()
            n = sweep.cancel()
            cancels.append(time.perf_counter() - t)
            cancel_requests = counting.requests - before
            assert n == args.trials, n
        print(
            f"sweep of {args.trials}: submit {statistics.median(submits):.2f} s "
            f"({sub_requests} request), cancel {statistics.median(cancels):.2f} s "
            f"({cancel_requests} request)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
