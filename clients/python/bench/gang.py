"""How long a gang takes to form, timed against a real server (``serve --demo``, the debug
build that ``scripts/run.sh`` serves): a 4-worker DDP task (PyTorch's gloo, Debian's
``python3-torch``) is submitted, and each rank prints the wall-clock time at which its first
training step (an all-reduce across the four) returned. Reports, per run, the seconds from the
submission to the last rank's first step, and their median.

    scripts/bench-gang.sh [--runs N]    # builds the server, then runs this
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from demo import demo_server

import autodl

TORCH_PYTHON = "/usr/bin/python3"

TRAIN = """
import time, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("gloo", init_method="env://")
model = DDP(torch.nn.Linear(10, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05)
x = torch.randn(64, 10)
for step in range(5):
    opt.zero_grad()
    model(x).pow(2).mean().backward()
    opt.step()
    if step == 0:
        print(f"FIRST_STEP {dist.get_rank()} {time.time():.6f}", flush=True)
dist.destroy_process_group()
"""


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--server", default=os.environ.get("AUTODL_SERVER_BIN"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--workers", type=int, default=4)
    args = ap.parse_args()
    if not os.path.exists(TORCH_PYTHON) or os.system(f"{TORCH_PYTHON} -c 'import torch'") != 0:
        print("Debian's python3-torch is needed (apt install python3-torch)", file=sys.stderr)
        return 2
    tmp = Path(tempfile.mkdtemp(prefix="autodl-bench-"))
    code = tmp / "gang-code"
    code.mkdir()
    (code / "train.py").write_text(TRAIN)
    with demo_server(args.server, tmp, (str(code),)) as (url, token):
        client = autodl.Client(api_key=token, base_url=url, timeout=120)
        seconds = []
        for run in range(args.runs):
            submitted = time.time()
            task = client.submit_spec(
                {
                    "name": f"gang-{run}",
                    "image": "none",
                    "num_workers": args.workers,
                    "gpu_per_worker": 1,
                    "resources": {"gpu": {"type": "A100"}},
                    "command": [TORCH_PYTHON, str(code / "train.py")],
                }
            )
            state = task.wait(timeout=300, poll=0.2)
            lines = task.logs()
            firsts = [float(l.split()[2]) for l in lines if l.startswith("FIRST_STEP ")]
            if state != "COMPLETED" or len(firsts) != args.workers:
                print(f"run {run}: {state}, {len(firsts)} ranks stepped", file=sys.stderr)
                print("\n".join(lines[-20:]), file=sys.stderr)
                return 1
            seconds.append(max(firsts) - submitted)
            print(f"run {run}: first step of all {args.workers} ranks {seconds[-1]:.2f} s after submission")
    print(
        f"{args.workers}-worker gang, submission -> first step: median {statistics.median(seconds):.2f} s"
        f" (min {min(seconds):.2f}, max {max(seconds):.2f}, {len(seconds)} runs)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
