"""The ``autodl`` command: submit and follow tasks from a shell.

Exit status: 0 on success, 1 when the server refuses or cannot be reached (with the server's
message on stderr), 2 for usage errors (argparse).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, TextIO

import yaml

from ._version import __version__
from .client import Client
from .errors import AutodlError, ValidationError
from .task import Task


def _load_config(path: str) -> Mapping[str, Any]:
    """A task configuration from YAML or JSON (JSON is YAML, but its errors read better)."""
    name = "standard input" if path == "-" else path
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ValidationError(f"{name}: cannot read it: {exc.strerror or exc}") from exc
    try:
        data = json.loads(text) if path.endswith(".json") else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValidationError(
            f"{name} is not valid {'JSON' if path.endswith('.json') else 'YAML'}: {exc}"
        ) from exc
    if not isinstance(data, Mapping):
        raise ValidationError(
            f"{name}: expected a mapping of task settings at the top level, "
            'e.g. "name: train\\nimage: pytorch/pytorch:2.1\\ncommand: python train.py"'
        )
    return data


def _gpus(info: Mapping[str, Any]) -> str:
    """``8xA100`` from a task's normalised spec (``gpus_per_worker``, ``gpu_types``), or
    from a submitted-style spec (``resources.gpu``) should a server return that."""
    spec = info.get("spec") or {}
    gpu = (spec.get("resources") or {}).get("gpu") or {}
    count = spec.get("gpus_per_worker", spec.get("gpu_per_worker", gpu.get("count", 1)))
    workers = spec.get("num_workers", 1) or 1
    kind = spec.get("gpu_types", gpu.get("type")) or "any"
    if isinstance(kind, list):
        kind = "|".join(kind) or "any"
    total = (count or 0) * workers
    return f"{total}x{kind}" if total else "-"


def _nodes_of(info: Mapping[str, Any]) -> str:
    placement = info.get("placement") or []
    return ",".join(str(p.get("node")) for p in placement) or "-"


def _table(rows: List[List[str]], headers: List[str], out: TextIO) -> None:
    widths = [len(h) for h in headers]
    for row in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths))
    out.write(line.rstrip() + "\n")
    for row in rows:
        out.write("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip() + "\n")


def _human_bytes(value: Any) -> str:
    if not isinstance(value, (int, float)):
        return str(value) if value is not None else "-"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if size < 1024 or unit == "TiB":
            return (
                f"{size:.0f}{unit}" if unit in ("B", "KiB") or size >= 10 else f"{size:.1f}{unit}"
            )
        size /= 1024
    return str(value)  # pragma: no cover


def _print_task(task: Task, out: TextIO) -> None:
    info = task.info
    out.write(f"id:       {task.id}\n")
    out.write(f"name:     {info.get('name')}\n")
    out.write(f"status:   {task.status}\n")
    out.write(f"user:     {info.get('user_email') or info.get('user_id') or '-'}\n")
    out.write(f"gpus:     {_gpus(info)}\n")
    out.write(f"created:  {info.get('created_at', '-')}\n")
    out.write(f"attempts: {info.get('attempts', 0)}\n")
    if info.get("batch_size") is not None:
        out.write(f"batch:    {info['batch_size']}\n")
    for p in info.get("placement") or []:
        out.write(f"placed:   {p.get('node')} GPUs {p.get('gpu_indices')}\n")
    waiting = info.get("waiting")
    if waiting:
        where = f" (position {waiting['position']})" if waiting.get("position") is not None else ""
        out.write(
            f"waiting:  {waiting.get('reason') or '-'}{where}: {waiting.get('message', '')}\n"
        )
        out.write(f"starts:   {waiting.get('estimated_start') or 'not estimated yet'}\n")


# Commands --------------------------------------------------------------------------------


def cmd_submit(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    config = _load_config(args.file)
    task = client.submit_task(config, idempotency_key=args.idempotency_key)
    if args.json:
        out.write(json.dumps(task.info, indent=2) + "\n")
    else:
        out.write(f"{task.id}\n")
    return 0


def cmd_ls(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    tasks = list(
        client.list_tasks(
            state=args.state, label=args.label or None, user=args.user, limit=args.limit
        )
    )
    if args.json:
        out.write(json.dumps([t.info for t in tasks], indent=2) + "\n")
        return 0
    rows = [
        [
            t.id,
            str(t.info.get("name", "")),
            t.status,
            _gpus(t.info),
            _nodes_of(t.info),
            str(t.info.get("created_at", "")),
        ]
        for t in tasks
    ]
    _table(rows, ["ID", "NAME", "STATUS", "GPUS", "NODES", "CREATED"], out)
    return 0


def cmd_status(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    task = client.get_task(args.id)
    if args.json:
        out.write(json.dumps(task.info, indent=2) + "\n")
    else:
        _print_task(task, out)
    return 0


def cmd_logs(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    task = client.task(args.id)
    for line in task.logs(follow=args.follow):
        out.write(line + "\n")
        out.flush()
    return 0


def cmd_cancel(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    task = client.task(args.id)
    out.write(f"{task.id} {task.cancel()}\n")
    return 0


def cmd_download(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    path = client.task(args.id).download_results(args.dir)
    out.write(f"results of {args.id} extracted into {path}\n")
    return 0


def cmd_nodes(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    nodes = client.nodes()
    if args.json:
        out.write(json.dumps(nodes, indent=2) + "\n")
        return 0
    rows = []
    for n in nodes:
        gpus = n.get("gpus") or []
        kinds: Dict[str, int] = {}
        for g in gpus:
            kinds[str(g.get("type"))] = kinds.get(str(g.get("type")), 0) + 1
        busy = sum(1 for g in gpus if g.get("tasks"))
        rows.append(
            [
                str(n.get("id")),
                str(n.get("zone", "-")),
                ", ".join(f"{c}x{k}" for k, c in kinds.items()) or "-",
                f"{busy}/{len(gpus)}",
                str(n.get("cpu", "-")),
                _human_bytes(n.get("memory")),
                "yes" if n.get("schedulable", True) else "no",
            ]
        )
    _table(rows, ["NODE", "ZONE", "GPUS", "BUSY", "CPU", "MEMORY", "SCHEDULABLE"], out)
    return 0


def build_parser() -> argparse.ArgumentParser:
    # Connection options are accepted before or after the sub-command.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--api-url", default=argparse.SUPPRESS, help="server address (AUTODL_API_URL)"
    )
    common.add_argument("--api-key", default=argparse.SUPPRESS, help="API key (AUTODL_API_KEY)")

    parser = argparse.ArgumentParser(
        prog="autodl", description="Submit and follow autodl training tasks.", parents=[common]
    )
    parser.add_argument("--version", action="version", version=f"autodl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("submit", parents=[common], help="submit a task from a YAML or JSON file")
    p.add_argument("file", help="task configuration (YAML or JSON; '-' reads stdin)")
    p.add_argument("--idempotency-key", help="re-sending with the same key returns the same task")
    p.add_argument("--json", action="store_true", help="print the whole task document")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("ls", parents=[common], help="list tasks, newest first")
    p.add_argument("--state", help="only tasks in this state (e.g. running)")
    p.add_argument(
        "--label", action="append", metavar="KEY=VALUE", help="only tasks with this label"
    )
    p.add_argument("--user", help="only tasks of this user id, or 'me'")
    p.add_argument("--limit", type=int, default=None, help="at most this many tasks")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_ls)

    p = sub.add_parser("status", parents=[common], help="show one task")
    p.add_argument("id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_status)

    p = sub.add_parser("logs", parents=[common], help="print a task's output")
    p.add_argument("id")
    p.add_argument("-f", "--follow", action="store_true", help="keep printing until the task ends")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser("cancel", parents=[common], help="cancel a task")
    p.add_argument("id")
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("download", parents=[common], help="download and extract a task's results")
    p.add_argument("id")
    p.add_argument("dir", nargs="?", default="./output", help="target directory (default ./output)")
    p.set_defaults(func=cmd_download)

    p = sub.add_parser("nodes", parents=[common], help="list the cluster's nodes")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_nodes)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    out, err = sys.stdout, sys.stderr
    try:
        with Client(
            api_key=getattr(args, "api_key", None), base_url=getattr(args, "api_url", None)
        ) as client:
            return int(args.func(client, args, out))
    except AutodlError as exc:
        err.write(f"autodl: error: {exc}\n")
        return 1
    except (OSError, ValueError, yaml.YAMLError) as exc:
        err.write(f"autodl: error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
