"""The ``autodl`` command: submit and follow tasks from a shell.

Exit status: 0 on success, 1 when the server refuses or cannot be reached (with the server's
message on stderr), 2 for usage errors (argparse).
"""

from __future__ import annotations

import argparse
import datetime as _dt
import getpass
import json
import os
import socket
import sys
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, TextIO, Tuple

import yaml

from . import profiles
from .spec import worker_count
from ._http import env_api_url
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
    workdir = data.get("workdir")
    if isinstance(workdir, str) and path != "-" and not os.path.isabs(workdir):
        # As in docker-compose: a relative folder is relative to the file naming it.
        data = {**data, "workdir": os.path.join(os.path.dirname(os.path.abspath(path)), workdir)}
    loaded: Mapping[str, Any] = data
    return loaded


def _gpus(info: Mapping[str, Any]) -> str:
    """``8xA100`` from a task's normalised spec (``gpus_per_worker``, ``gpu_types``), or
    from a submitted-style spec (``resources.gpu``) should a server return that."""
    spec = info.get("spec") or {}
    gpu = (spec.get("resources") or {}).get("gpu") or {}
    count = spec.get("gpus_per_worker", spec.get("gpu_per_worker", gpu.get("count", 1)))
    workers = spec.get("num_workers", 1) or 1
    if isinstance(workers, Mapping):
        workers = workers.get("max", 1) or 1
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


def _show(
    out: TextIO, args: argparse.Namespace, documents: Any, rows: List[List[str]], headers: List[str]
) -> int:
    """The raw documents with ``--json``, else a table."""
    if args.json:
        out.write(json.dumps(documents, indent=2) + "\n")
    else:
        _table(rows, headers, out)
    return 0


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
    if task.number is not None:
        out.write(f"number:   #{task.number}\n")
    out.write(f"name:     {info.get('name')}\n")
    out.write(f"status:   {task.status}\n")
    out.write(f"user:     {info.get('user_email') or info.get('user_id') or '-'}\n")
    out.write(f"gpus:     {_gpus(info)}\n")
    out.write(f"created:  {_when(info.get('created_at'))}\n")
    out.write(f"attempts: {info.get('attempts', 0)}\n")
    if info.get("batch_size") is not None:
        out.write(f"batch:    {info['batch_size']}\n")
    for p in info.get("placement") or []:
        out.write(f"placed:   {p.get('node')} GPUs {p.get('gpu_indices')}\n")
    if task.status in ("FAILED", "CANCELLED"):
        # Why it ended, without a second command: the last run's exit code, reason and node.
        runs = task.attempts()
        last = runs[-1] if runs else None
        if last:
            code = last.get("exit_code")
            out.write(
                f"ended:    {last.get('reason') or 'exited'}"
                f"{f', exit code {code}' if code is not None else ''}"
                f" on {last.get('node') or '-'} (attempt {last.get('number')})\n"
            )
    waiting = info.get("waiting")
    if waiting:
        # The API counts from 0; people (and `autodl queue`, and the page) from 1.
        position = waiting.get("position")
        where = f" (position {position + 1})" if isinstance(position, int) else ""
        out.write(
            f"waiting:  {waiting.get('reason') or '-'}{where}: {waiting.get('message', '')}\n"
        )
        start = waiting.get("estimated_start")
        out.write(f"starts:   {_when(start) if start else 'not estimated yet'}\n")


# Commands --------------------------------------------------------------------------------


def cmd_submit(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    config = dict(_load_config(args.file))
    if args.workdir:
        config["workdir"] = args.workdir
    task = client.submit_task(config, idempotency_key=args.idempotency_key)
    if args.json:
        out.write(json.dumps(task.info, indent=2) + "\n")
    else:
        out.write(f"{task.id}\n")
    return 0


def _states(values: Optional[List[str]]) -> List[Optional[str]]:
    """``--state running --state pending`` or ``--state running,pending``; none means all."""
    states = [s.strip().lower() for v in values or [] for s in v.split(",") if s.strip()]
    return list(dict.fromkeys(states)) or [None]


def _list(client: Client, args: argparse.Namespace) -> List[Task]:
    """Tasks in any of the requested states, newest first."""
    tasks: List[Task] = []
    for state in _states(args.state):
        tasks.extend(
            client.list_tasks(
                state=state, label=args.label or None, user=args.user, limit=args.limit
            )
        )
    tasks.sort(key=lambda t: str(t.info.get("created_at", "")), reverse=True)
    return tasks[: args.limit] if args.limit else tasks


def _number(t: Task) -> str:
    """``#412``: what people say and type (``autodl status '#412'``)."""
    return f"#{t.number}" if t.number is not None else "-"


def cmd_ls(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    tasks = _list(client, args)
    if args.json:
        out.write(json.dumps([t.info for t in tasks], indent=2) + "\n")
        return 0
    rows = [
        [
            _number(t),
            t.id,
            str(t.info.get("name", "")),
            t.status,
            _gpus(t.info),
            _nodes_of(t.info),
            _when(t.info.get("created_at")),
        ]
        for t in tasks
    ]
    _table(rows, ["#", "ID", "NAME", "STATUS", "GPUS", "NODES", "CREATED"], out)
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
    for line in task.logs(follow=args.follow, markers=True, rank=args.rank):
        out.write(line + "\n")
        out.flush()
    return 0


def cmd_export(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    spec = client.task(args.id).export()
    if args.json:
        out.write(json.dumps(spec, indent=2) + "\n")
    else:
        out.write(yaml.safe_dump(spec, sort_keys=False, allow_unicode=True))
    return 0


def _set(spec: Dict[str, Any], assignment: str) -> None:
    """``--set resources.gpu.count=2``: the value is read as YAML (numbers, lists, true), but
    for ``env.NAME``."""
    path, sep, text = assignment.partition("=")
    if not sep or not path:
        raise ValidationError(f"--set {assignment!r}: write KEY=VALUE", field="set")
    node = spec
    keys = path.split(".")
    for key in keys[:-1]:
        child = node.get(key)
        if not isinstance(child, dict):
            child = node[key] = {}
        node = child
    # Environment values are text as written ("3e-4" stays "3e-4").
    node[keys[-1]] = text if keys[0] == "env" or not text else yaml.safe_load(text)


def cmd_clone(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """A new task from another's spec (``retry`` is the same with nothing changed)."""
    spec = client.task(args.id).export()
    for assignment in getattr(args, "set", None) or []:
        _set(spec, assignment)
    task = client.submit_spec(spec)
    out.write(task.id + "\n")
    return 0


def cmd_cancel(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    ids = list(args.ids)
    if args.label:
        matched = []
        for state in ("pending", "scheduled", "running"):
            matched.extend(t.id for t in client.list_tasks(state=state, label=args.label))
        if matched and not args.yes and not _confirm(
            f"cancel {len(matched)} task(s) labelled {args.label}: {', '.join(matched)}?"
        ):
            raise ValidationError(
                f"{len(matched)} task(s) match --label {args.label}; nothing cancelled "
                "(add --yes to cancel them without asking)",
                field="label",
            )
        ids.extend(matched)
    if not ids:
        raise ValidationError("name the tasks to cancel, or select them with --label KEY=VALUE")
    failed = 0
    for task_id in dict.fromkeys(ids):
        try:
            out.write(f"{task_id} {client.task(task_id).cancel()}\n")
        except AutodlError as exc:
            failed += 1
            sys.stderr.write(f"autodl: error: {task_id} not cancelled: {exc}\n")
    return 1 if failed else 0


def _confirm(question: str) -> bool:
    """Asks on the terminal; without one (a script, a pipe) the answer is no."""
    if not sys.stdin.isatty():
        return False
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _param(text: str) -> Tuple[str, Any]:
    """``lr=0.1,0.01`` (a list) or ``lr=1e-5:1e-1:log`` / ``layers=2:8:int`` (a range)."""
    name, sep, values = text.partition("=")
    if not sep or not name or not values:
        raise ValidationError(
            f"--param {text!r}: write NAME=v1,v2,... or NAME=MIN:MAX[:log][:int]",
            field="parameters",
        )

    def scalar(v: str) -> Any:
        for kind in (int, float):
            try:
                return kind(v)
            except ValueError:
                pass
        return v

    parts = values.split(":")
    if len(parts) >= 2 and all(isinstance(scalar(p), (int, float)) for p in parts[:2]):
        flags = set(parts[2:])
        unknown = flags - {"log", "int"}
        if unknown:
            raise ValidationError(
                f"--param {text!r}: a range's options are log and int, not {sorted(unknown)}",
                field="parameters",
            )
        rng: Dict[str, Any] = {"min": scalar(parts[0]), "max": scalar(parts[1])}
        if "log" in flags:
            rng["log"] = True
        if "int" in flags:
            rng["integer"] = True
        return name, rng
    return name, [scalar(v) for v in values.split(",") if v != ""]


def _print_sweep(sweep: Any, out: TextIO) -> None:
    info = sweep.info
    states = ", ".join(f"{n} {s}" for s, n in sorted(sweep.states.items())) or "no trials"
    out.write(
        f"{sweep.id}  {sweep.name}  {info.get('method')}  {sweep.trials} trials "
        f"(at most {info.get('max_concurrency')} at once): {states}\n"
    )
    rows = sweep.rows
    if not rows:
        return
    params = list(info.get("parameters") or [])
    metrics = sorted({k for r in rows for k in (r.get("metrics") or {})})
    table = [
        [str(r["trial"]), "stopped" if r.get("stopped_early") else r["state"]]
        + [json.dumps(r["params"].get(p)) for p in params]
        + [_metric(r["metrics"].get(m)) for m in metrics]
        + [r["task_id"]]
        for r in rows
    ]
    _table(table, ["TRIAL", "STATE", *params, *metrics, "TASK"], out)


def _metric(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def cmd_sweep(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    if args.sweep_command == "ls":
        sweeps = client.list_sweeps(limit=args.limit)
        if args.json:
            out.write(json.dumps([s.info for s in sweeps], indent=2) + "\n")
            return 0
        rows = [
            [
                s.id,
                s.name,
                str(s.trials),
                ", ".join(f"{n} {st}" for st, n in sorted(s.states.items())),
                _when(s.info.get("created_at")),
            ]
            for s in sweeps
        ]
        _table(rows, ["ID", "NAME", "TRIALS", "STATES", "CREATED"], out)
        return 0
    if args.sweep_command == "show":
        sweep = client.get_sweep(args.id)
        if args.json:
            out.write(json.dumps(sweep.info, indent=2) + "\n")
        else:
            _print_sweep(sweep, out)
        return 0
    if args.sweep_command == "cancel":
        n = client.get_sweep(args.id).cancel()
        out.write(f"{args.id}: {n} trials cancelled\n")
        return 0
    # run
    config = dict(_load_config(args.file))
    if args.workdir:
        config["workdir"] = args.workdir
    parameters = dict(_param(p) for p in args.param or [])
    sweep = client.submit_sweep(
        config,
        parameters=parameters,
        method="asha" if args.asha else "random" if args.samples else "grid",
        samples=args.samples,
        seed=args.seed,
        max_concurrency=args.max_concurrency,
        name=args.name,
        metric=args.metric,
        mode=args.mode,
        max_resource=args.asha,
        resource=args.resource,
        reduction_factor=args.reduction_factor,
    )
    if args.json:
        out.write(json.dumps(sweep.info, indent=2) + "\n")
    else:
        out.write(f"{sweep.id}\n")
    return 0


def cmd_queue(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    """The organization's queue, like ``squeue``: what runs, then what waits in its order."""
    active = {s: list(client.list_tasks(state=s, user=args.user)) for s in ("running", "scheduled")}
    pending = list(client.list_tasks(state="pending", user=args.user))
    pending.sort(
        key=lambda t: (
            (t.waiting or {}).get("position") is None,
            (t.waiting or {}).get("position") or 0,
        )
    )
    tasks = active["running"] + active["scheduled"] + pending
    rows = []
    for t in tasks:
        w = t.waiting or {}
        position = w.get("position")
        rows.append(
            [
                _number(t),
                t.id,
                str(t.info.get("name", "")),
                str(t.info.get("user_email") or "-"),
                t.status,
                _gpus(t.info),
                str(position + 1) if isinstance(position, int) else "-",
                str(w.get("estimated_start") or ("-" if t.status != "PENDING" else "unknown")),
                _nodes_of(t.info) if t.status != "PENDING" else str(w.get("message") or "-"),
            ]
        )
    headers = ["#", "ID", "NAME", "USER", "STATE", "GPUS", "POS", "EST. START", "NODES/REASON"]
    return _show(out, args, [t.info for t in tasks], rows, headers)


def cmd_events(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    events = client.task(args.id).events()
    rows = [[str(e.get("at")), str(e.get("kind")), str(e.get("message"))] for e in events]
    return _show(out, args, events, rows, ["AT", "KIND", "MESSAGE"])


def cmd_attempts(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    attempts = client.task(args.id).attempts()
    rows = [
        [
            str(a.get("number")),
            str(a.get("node") or "-"),
            _when(a.get("started_at")),
            _when(a.get("ended_at")) if a.get("ended_at") else "running",
            "-" if a.get("exit_code") is None else str(a.get("exit_code")),
            str(a.get("reason") or ("-" if not a.get("ended_at") else "success")),
            "-" if a.get("batch_size") is None else str(a.get("batch_size")),
            f"{float(a.get('gpu_seconds') or 0) / 3600:.2f}",
        ]
        for a in attempts
    ]
    headers = ["#", "NODE", "STARTED", "ENDED", "EXIT", "REASON", "BATCH", "GPU-H"]
    return _show(out, args, attempts, rows, headers)


def cmd_metrics(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    samples = client.task(args.id).metrics()
    names: List[str] = []
    for sample in samples:
        for key in sample:
            if key not in ("at", "values") and key not in names:
                names.append(key)
        for key in sample.get("values") or {}:
            if key not in names:
                names.append(key)
    rows = []
    for sample in samples[-args.tail :] if args.tail else samples:
        values = {
            **{k: v for k, v in sample.items() if k not in ("at", "values")},
            **(sample.get("values") or {}),
        }
        rows.append([_when(sample.get("at"))] + [_sample_cell(n, values.get(n)) for n in names])
    return _show(out, args, samples, rows, ["AT"] + [n.upper() for n in names])


def _sample_cell(name: str, value: Any) -> str:
    """A metric as a person reads it: GPU utilisation in percent, GPU memory in GiB, other
    numbers with the digits that tell them apart."""
    if value is None:
        return "-"
    if name == "gpu_util" and isinstance(value, (int, float)):
        return f"{value * 100:.0f}%"
    if name in ("mem_used", "mem_total") and isinstance(value, (int, float)):
        return f"{value / 2**30:.1f} GiB"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _when(text: Any) -> str:
    """An RFC 3339 time from the server in this machine's time zone, to the second."""
    if not text:
        return "-"
    try:
        at = _dt.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        return str(text)
    if at.tzinfo is None:
        at = at.replace(tzinfo=_dt.timezone.utc)
    return at.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _gpu_request(text: str) -> Dict[str, Any]:
    """``A100:2``, ``2`` or ``A100`` (one GPU), as SkyPilot and dstack write it."""
    kind, _, count = text.rpartition(":") if ":" in text else ("", "", text)
    if not count.isdigit():
        kind, count = text, "1"
    gpu: Dict[str, Any] = {"count": int(count)}
    if kind:
        gpu["type"] = kind
    return gpu


def cmd_run(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise ValidationError(
            "give the command to run after --, e.g. autodl run -- python train.py", field="command"
        )
    config: Dict[str, Any] = {
        "name": args.name
        or os.path.basename(
            command[-1] if command[0] in ("python", "python3") and len(command) > 1 else command[0]
        ),
        "image": args.image or os.environ.get("AUTODL_DEFAULT_IMAGE") or "pytorch/pytorch:latest",
        "command": command,
        "resources": {"gpu": _gpu_request(args.gpus)},
    }
    if args.cpu is not None:
        config["resources"]["cpu"] = args.cpu
    if args.memory:
        config["resources"]["memory"] = args.memory
    if args.workers:
        config["num_workers"] = worker_count(args.workers)
    if args.launcher:
        config["launcher"] = args.launcher
    if args.time_limit:
        config["time_limit"] = args.time_limit
    if args.workdir:
        config["workdir"] = args.workdir
    if args.data:
        config["data_path"] = args.data
    if args.requirements:
        config["requirements"] = args.requirements
    if args.setup:
        config["setup"] = args.setup
    if args.after:
        config["after"] = [i for a in args.after for i in a.split(",") if i]
        if args.after_any:
            config["after_when"] = "any"
    if args.env:
        config["env"] = dict(e.partition("=")[::2] for e in args.env)
    if args.label:
        config["labels"] = dict(lab.partition("=")[::2] for lab in args.label)
    task = client.submit_task(config)
    out.write(f"{task.id}\n")
    out.flush()
    if args.detach:
        return 0
    err = sys.stderr
    err.write(f"autodl: following {task.id} (Ctrl-C detaches; the task keeps running)\n")
    try:
        for line in task.logs(follow=True, markers=True):
            out.write(line + "\n")
            out.flush()
    except KeyboardInterrupt:
        err.write(
            f"\nautodl: detached; follow again with `autodl logs -f {task.id}`, "
            f"stop it with `autodl cancel {task.id}`\n"
        )
        return 0
    status = task.wait(timeout=30, poll=0.5)
    err.write(f"autodl: {task.id} {status}\n")
    return 0 if status == "COMPLETED" else 1


def cmd_login(args: argparse.Namespace, out: TextIO) -> int:
    """Checks the server and key, then saves them as a profile ``Client()`` and this CLI use."""
    url = getattr(args, "api_url", None) or env_api_url()
    key = getattr(args, "api_key", None)
    if not key and args.email:
        password = os.environ.get("AUTODL_PASSWORD") or getpass.getpass(
            f"Password for {args.email}: "
        )
        with Client.login(args.email, password, base_url=url) as session:
            key = session.create_api_key(f"cli {socket.gethostname()}")["key"]
    if not key:
        if not sys.stdin.isatty():
            raise ValidationError(
                "give --api-key KEY (made on the web app's Account page) or --email",
                field="api_key",
            )
        key = getpass.getpass("API key (from the web app's Account page): ").strip()
    with Client(api_key=key, base_url=url) as client:
        me = client.me()
        path = profiles.save_profile(client.base_url, key, args.profile)
    name = profiles.profile_name(args.profile)
    out.write(
        f"signed in to {client.base_url} as {me.get('email')} ({me.get('tenant_name', '-')}); "
        f"saved as profile {name!r} in {path}\n"
    )
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


def _task_path(task_id: str, what: str) -> str:
    from urllib.parse import quote

    return f"/tasks/{quote(task_id, safe='')}/{what}"


def _until_running(client: Client, task_id: str, timeout: float) -> None:
    """Waits for a task that has not started yet (a session just submitted), saying so once;
    a finished task is an error at once."""
    import time

    deadline = time.monotonic() + timeout
    told = False
    while True:
        task = client.get_task(task_id)
        status = task.status
        if status == "RUNNING":
            return
        if task.finished:
            raise AutodlError(
                f"task {task_id} is {status.lower()}: only a running task can be reached"
            )
        if time.monotonic() >= deadline:
            raise AutodlError(
                f"task {task_id} did not start within {timeout:.0f} s ({status.lower()})"
            )
        if not told:
            why = (task.waiting or {}).get("message") or status.lower()
            sys.stderr.write(f"autodl: waiting for {task_id} to start ({why})\n")
            told = True
        time.sleep(1.0)


def cmd_exec(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    from .tunnel import run_exec

    argv = list(args.argv[1:] if args.argv[:1] == ["--"] else args.argv)
    if not argv:
        raise ValidationError("give the command after the task id, e.g. -- nvidia-smi")
    data = sys.stdin.buffer.read() if args.stdin else None
    _until_running(client, args.id, args.wait)
    ws = client.tunnel(_task_path(args.id, "exec"), command=json.dumps(argv), rank=args.rank)
    err = sys.stderr

    def to_out(b: bytes) -> None:
        out.write(b.decode("utf-8", "replace"))
        out.flush()

    def to_err(b: bytes) -> None:
        err.write(b.decode("utf-8", "replace"))
        err.flush()

    # The command's own exit status, as ssh and kubectl exec give it.
    return run_exec(ws, stdin=data, on_stdout=to_out, on_stderr=to_err)


def cmd_shell(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    from .tunnel import interactive, terminal_size

    cols, rows = terminal_size()
    _until_running(client, args.id, args.wait)
    ws = client.tunnel(_task_path(args.id, "shell"), cols=cols, rows=rows, rank=args.rank)
    stdout = getattr(out, "buffer", sys.stdout.buffer)
    return interactive(ws, sys.stdin.buffer, stdout)


def _ports(text: str) -> Tuple[int, int]:
    local, _, remote = text.rpartition(":")
    try:
        pair = (int(local or remote), int(remote))
    except ValueError:
        raise ValidationError(
            f"a port is REMOTE or LOCAL:REMOTE, e.g. 8888 or 9000:8888, not {text!r}",
            field="port",
        ) from None
    if not all(0 <= p <= 65535 for p in pair) or pair[1] == 0:
        raise ValidationError(f"ports are 1 to 65535, not {text!r}", field="port")
    return pair


def cmd_port_forward(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    from .tunnel import serve_forward

    local, remote = _ports(args.port)
    _until_running(client, args.id, args.wait)
    # Asking once up front turns a refusal (no such task, undeclared port) into an error
    # now, not at the first connection.
    client.tunnel(_task_path(args.id, f"ports/{remote}"), rank=args.rank).close()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((args.address, local))
    listener.listen(16)
    host, bound = listener.getsockname()[:2]
    out.write(f"Forwarding from {host}:{bound} -> {args.id}:{remote} (Ctrl-C to stop)\n")
    out.flush()

    def open_ws() -> Any:
        return client.tunnel(_task_path(args.id, f"ports/{remote}"), rank=args.rank)

    with listener:
        serve_forward(listener, open_ws)
    return 0


def cmd_open(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    _until_running(client, args.id, args.wait)
    url = client.app_url(args.id, args.port, args.path)
    out.write(f"{url}\n(the link is good once, within a minute)\n")
    out.flush()
    if not args.print_only:
        import webbrowser

        webbrowser.open(url)
    return 0


def cmd_ssh_config(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    from .ssh import config_dir, config_entry, host_alias

    task = client.get_task(args.id)
    # Where ssh keeps the proxy's host key once it has seen it.
    config_dir().mkdir(parents=True, exist_ok=True)
    alias = args.name or host_alias(args.id)
    out.write(config_entry(alias, task.id, client.base_url))
    if out.isatty():
        sys.stderr.write(
            f"autodl: add it to ~/.ssh/config (autodl ssh-config {args.id} >> ~/.ssh/config),"
            f" then: ssh {alias}, or VS Code's Remote-SSH on {alias}\n"
        )
    return 0


def cmd_ssh_proxy(client: Client, args: argparse.Namespace, out: TextIO) -> int:
    from .ssh import Proxy, host_key, serve_stdio

    _until_running(client, args.id, args.wait)
    task = client.get_task(args.id)
    proxy = Proxy(client, task.id, _task_path, declared=task.info["spec"].get("ports") or [])
    return serve_stdio(proxy, host_key())


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
    p.add_argument(
        "--workdir", help="a folder to run the task in (packed and uploaded; overrides the file's)"
    )
    p.add_argument("--json", action="store_true", help="print the whole task document")
    p.set_defaults(func=cmd_submit)

    p = sub.add_parser("login", parents=[common], help="save a server and API key as a profile")
    p.add_argument(
        "--email", help="sign in with email and password; an API key is made for this machine"
    )
    p.add_argument("--profile", help="profile name (default: $AUTODL_PROFILE or 'default')")
    p.set_defaults(func=None)

    p = sub.add_parser(
        "run", parents=[common], help="submit a command and follow its output until it ends"
    )
    p.add_argument(
        "--gpus",
        default="1",
        metavar="[TYPE:]COUNT",
        help="GPUs per worker, e.g. A100:2 (default 1)",
    )
    p.add_argument(
        "--image", help="container image (default $AUTODL_DEFAULT_IMAGE or pytorch/pytorch:latest)"
    )
    p.add_argument("--name", help="task name (default: the script's name)")
    p.add_argument("--cpu", type=float, help="CPU cores per worker")
    p.add_argument("--memory", help="RAM per worker, e.g. 32GiB")
    p.add_argument(
        "--workers",
        help="workers of a gang (default 1), or a range such as 2-8 for one that grows and shrinks",
    )
    p.add_argument(
        "--launcher",
        choices=("workers", "torchrun", "none"),
        help="how workers start: a process each with RANK/WORLD_SIZE (workers, the default), "
        "one torchrun per node (torchrun), or one process per node (none)",
    )
    p.add_argument("--time-limit", help="stop a run after this long, e.g. 2h30m (ends TIMED_OUT)")
    p.add_argument(
        "--workdir",
        metavar="DIR",
        help="run in this folder's code (packed, uploaded once; .gitignore/.autodlignore apply)",
    )
    p.add_argument(
        "--data", metavar="URL", help="data_path: s3://bucket/path, or a folder the nodes share"
    )
    p.add_argument(
        "--requirements",
        metavar="FILE",
        help="pip install this file of --workdir into the task's environment (built once per "
        "node, then reused)",
    )
    p.add_argument(
        "--setup",
        action="append",
        metavar="COMMAND",
        help="a command preparing the task's environment, run once per node (repeat)",
    )
    p.add_argument(
        "--after", action="append", metavar="ID", help="start once this task completed (repeat)"
    )
    p.add_argument(
        "--after-any", action="store_true", help="with --after: once they ended, however"
    )
    p.add_argument("--env", action="append", metavar="KEY=VALUE", help="an environment variable")
    p.add_argument("--label", action="append", metavar="KEY=VALUE", help="a label")
    p.add_argument("-d", "--detach", action="store_true", help="print the task id and return")
    p.add_argument("cmd", nargs=argparse.REMAINDER, help="-- then the command")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "sweep", parents=[common], help="run a task file over a parameter grid or random search"
    )
    sweeps = p.add_subparsers(dest="sweep_command", metavar="SWEEP_COMMAND")
    sweeps.required = True
    s = sweeps.add_parser(
        "run", parents=[common], help="submit FILE once per trial (${NAME} takes each value)"
    )
    s.add_argument("file", help="task configuration (YAML or JSON) with ${NAME} placeholders")
    s.add_argument(
        "--param",
        action="append",
        metavar="NAME=VALUES",
        help="lr=0.1,0.01 (a list) or lr=1e-5:1e-1:log, layers=2:8:int (a range, with --samples)",
    )
    s.add_argument("--samples", type=int, help="draw this many random trials (default: the grid)")
    s.add_argument("--seed", type=int, help="makes random draws repeatable")
    s.add_argument("--max-concurrency", type=int, help="trials running at once (default: all)")
    s.add_argument("--name", help="the sweep's name (default: the task's)")
    s.add_argument("--metric", help="what the sweep optimises (for `sweep show` and --asha)")
    s.add_argument("--mode", choices=("min", "max"), help="a smaller (default) or larger metric is better")
    s.add_argument(
        "--asha",
        type=float,
        metavar="MAX_STEPS",
        help="stop trials behind early (ASHA) at rungs 1, 3, 9, ... up to MAX_STEPS of --resource",
    )
    s.add_argument("--resource", help="with --asha: the reported number counting progress (step)")
    s.add_argument("--reduction-factor", type=int, help="with --asha: keep the best 1/N at a rung (3)")
    s.add_argument("--workdir", help="a folder to run every trial in (packed and uploaded once)")
    s.add_argument("--json", action="store_true")
    s = sweeps.add_parser("ls", parents=[common], help="the organization's sweeps")
    s.add_argument("--limit", type=int, default=50)
    s.add_argument("--json", action="store_true")
    s = sweeps.add_parser(
        "show", parents=[common], help="a sweep's trials: parameters, state, newest metrics"
    )
    s.add_argument("id")
    s.add_argument("--json", action="store_true")
    s = sweeps.add_parser("cancel", parents=[common], help="cancel every trial of a sweep")
    s.add_argument("id")
    p.set_defaults(func=cmd_sweep)

    p = sub.add_parser(
        "queue",
        parents=[common],
        help="the organization's running and waiting tasks, in queue order",
    )
    p.add_argument("--user", help="only tasks of this user id, or 'me'")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_queue)

    for name, func, what in (
        ("events", cmd_events, "a task's history"),
        ("attempts", cmd_attempts, "each run of a task: node, exit code, reason, batch size"),
    ):
        p = sub.add_parser(name, parents=[common], help=what)
        p.add_argument("id")
        p.add_argument("--json", action="store_true")
        p.set_defaults(func=func)

    p = sub.add_parser("metrics", parents=[common], help="a task's metric samples")
    p.add_argument("id")
    p.add_argument("--tail", type=int, default=20, help="the last N samples (0: all; default 20)")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_metrics)

    p = sub.add_parser("ls", parents=[common], help="list tasks, newest first")
    p.add_argument(
        "--state", action="append", help="only tasks in this state; repeat or separate with commas"
    )
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
    p.add_argument("--rank", type=int, help="only this worker's lines (a task of several workers)")
    p.set_defaults(func=cmd_logs)

    p = sub.add_parser(
        "export", parents=[common], help="a task's spec as YAML that `autodl submit` takes"
    )
    p.add_argument("id")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_export)
    p = sub.add_parser(
        "clone", parents=[common], help="submit a task again, changing what --set says"
    )
    p.add_argument("id")
    p.add_argument(
        "--set", action="append", metavar="KEY=VALUE", help="e.g. priority=0.8, env.LR=3e-4"
    )
    p.set_defaults(func=cmd_clone)
    p = sub.add_parser("retry", parents=[common], help="submit a task again as it was")
    p.add_argument("id")
    p.set_defaults(func=cmd_clone)

    p = sub.add_parser("cancel", parents=[common], help="cancel tasks")
    p.add_argument("ids", nargs="*", metavar="ID")
    p.add_argument(
        "--label", metavar="KEY=VALUE", help="also every unfinished task with this label"
    )
    p.add_argument(
        "-y", "--yes", action="store_true", help="cancel what --label matches without asking"
    )
    p.set_defaults(func=cmd_cancel)

    p = sub.add_parser("download", parents=[common], help="download and extract a task's results")
    p.add_argument("id")
    p.add_argument("dir", nargs="?", default="./output", help="target directory (default ./output)")
    p.set_defaults(func=cmd_download)

    p = sub.add_parser(
        "exec", parents=[common], help="run a command in a running task (owner and admins)"
    )
    p.add_argument("id")
    p.add_argument("argv", nargs=argparse.REMAINDER, metavar="-- COMMAND", help="what to run")
    p.add_argument("-i", "--stdin", action="store_true", help="send this program's input")
    p.add_argument("--rank", type=int, help="which worker of a multi-node task (default 0)")
    p.add_argument(
        "--wait", type=float, default=300, metavar="SECONDS", help="for a task not started yet"
    )
    p.set_defaults(func=cmd_exec)

    p = sub.add_parser("shell", parents=[common], help="an interactive shell in a running task")
    p.add_argument("id")
    p.add_argument("--rank", type=int, help="which worker of a multi-node task (default 0)")
    p.add_argument(
        "--wait", type=float, default=300, metavar="SECONDS", help="for a task not started yet"
    )
    p.set_defaults(func=cmd_shell)

    p = sub.add_parser(
        "port-forward",
        parents=[common],
        help="reach a port the task declared from this machine, e.g. 8888 or 9000:8888",
    )
    p.add_argument("id")
    p.add_argument("port", metavar="[LOCAL:]REMOTE")
    p.add_argument("--address", default="127.0.0.1", help="local address to listen on")
    p.add_argument("--rank", type=int, help="which worker of a multi-node task (default 0)")
    p.add_argument(
        "--wait", type=float, default=300, metavar="SECONDS", help="for a task not started yet"
    )
    p.set_defaults(func=cmd_port_forward)

    p = sub.add_parser(
        "ssh-config",
        parents=[common],
        help="an ~/.ssh/config entry that reaches the running task with ssh or VS Code",
    )
    p.add_argument("id")
    p.add_argument("--name", help="the host name ssh knows it by (default autodl-<task>)")
    p.set_defaults(func=cmd_ssh_config)

    p = sub.add_parser(
        "ssh-proxy",
        parents=[common],
        help="speak SSH on standard input and output for a task (the entry's ProxyCommand)",
    )
    p.add_argument("id")
    p.add_argument(
        "--wait", type=float, default=300, metavar="SECONDS", help="for a task not started yet"
    )
    p.set_defaults(func=cmd_ssh_proxy)

    p = sub.add_parser(
        "open",
        parents=[common],
        help="open a web port the task declared (JupyterLab, TensorBoard) in a browser",
    )
    p.add_argument("id")
    p.add_argument("port", type=int)
    p.add_argument("--path", default="/", help="the app's page to land on, e.g. /lab")
    p.add_argument(
        "--print", dest="print_only", action="store_true", help="print the link, open nothing"
    )
    p.add_argument(
        "--wait", type=float, default=300, metavar="SECONDS", help="for a task not started yet"
    )
    p.set_defaults(func=cmd_open)

    p = sub.add_parser("nodes", parents=[common], help="list the cluster's nodes")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_nodes)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    out, err = sys.stdout, sys.stderr
    try:
        if args.command == "login":
            return cmd_login(args, out)
        with Client(
            api_key=getattr(args, "api_key", None), base_url=getattr(args, "api_url", None)
        ) as client:
            return int(args.func(client, args, out))
    except AutodlError as exc:
        err.write(f"autodl: error: {exc}\n")
        return 1
    except BrokenPipeError:
        # The reader went away (`autodl logs -f | head`): end quietly, as Unix tools do, and
        # keep Python from complaining when it flushes standard output on the way out.
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        except (OSError, ValueError):
            pass
        return 141
    except (OSError, ValueError, yaml.YAMLError) as exc:
        err.write(f"autodl: error: {exc}\n")
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
