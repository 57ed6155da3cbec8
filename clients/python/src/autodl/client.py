"""The entry point of the SDK: a connection to one autodl server as one user."""

from __future__ import annotations

import os
import re
import shlex
import sys
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)
from urllib.parse import quote

import httpx

from ._http import HttpClient, env_api_key, env_api_url, server_root
from .errors import NotFound, ValidationError
from .spec import build_spec, in_users_terms, label_params
from .sweep import Sweep, parameters_body
from .task import Task
from .workdir import (
    MAX_BUNDLE_BYTES,
    cached_bundle,
    collect,
    fingerprint,
    pack,
    remember_bundle,
)

if TYPE_CHECKING:
    from .tunnel import ExecResult


class Client:
    """A connection to an autodl server.

    ``api_key`` (an ``adl_...`` key, or a login token) and ``base_url`` default to the
    ``AUTODL_API_KEY`` and ``AUTODL_API_URL`` environment variables (the latter to
    ``http://127.0.0.1:8080``). ``transport`` is for tests (``httpx.MockTransport``).
    Usable as a context manager to close its connection pool.
    """

    def __init__(
        self,
        api_key: Optional[str] = None,
        base_url: Optional[str] = None,
        *,
        timeout: float = 30.0,
        transport: Optional[httpx.BaseTransport] = None,
    ) -> None:
        self.api_key = api_key or env_api_key()
        self.base_url = server_root(base_url or env_api_url())
        self._http = HttpClient(self.base_url, self.api_key, timeout=timeout, transport=transport)

    def __repr__(self) -> str:
        return f"<autodl.Client {self.base_url}>"

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    @classmethod
    def login(
        cls,
        email: str,
        password: str,
        base_url: Optional[str] = None,
        **kwargs: Any,
    ) -> Client:
        """A client authenticated by a fresh login token (for creating API keys from a
        script); prefer API keys for anything long-lived."""
        http = HttpClient(base_url or env_api_url(), None, **kwargs)
        try:
            body = http.post("/auth/login", {"email": email, "password": password})
        finally:
            http.close()
        return cls(api_key=body["token"], base_url=base_url, **kwargs)

    # Tasks ---------------------------------------------------------------------------

    def submit_task(
        self,
        config: Optional[Mapping[str, Any]] = None,
        *,
        request: Any = None,
        idempotency_key: Optional[str] = None,
        **overrides: Any,
    ) -> Task:
        """Submits a task and returns its handle.

        ``config`` may use the article-style keys (``task_name``, ``checkpoint_path``,
        ``gpu_type``, ``commands``, ...) or be a native ``TaskSpec``; keyword ``overrides``
        are merged over it and ``request`` (a :class:`~autodl.scheduler.TaskRequest`) last.
        With ``idempotency_key``, re-sending the same submission (say after a network error)
        returns the task created the first time instead of a duplicate.
        """
        spec = build_spec(config, request=request, **overrides)
        try:
            return self.submit_spec(spec, idempotency_key=idempotency_key)
        except ValidationError as exc:
            raise in_users_terms(exc, config, overrides) from exc

    def submit_spec(
        self, spec: Mapping[str, Any], *, idempotency_key: Optional[str] = None
    ) -> Task:
        """Submits a native ``TaskSpec``. A ``workdir`` in it (a folder, or a ``.tar.gz`` /
        ``.zip`` of one) is packed and uploaded first (:meth:`upload_code`), and the task
        runs in it: ``entry_point: train.py`` then finds ``train.py``."""
        headers = {"Idempotency-Key": idempotency_key} if idempotency_key else None
        info = self._http.post("/tasks", self._with_code(spec), headers=headers)
        return Task(self, info)

    def _with_code(self, spec: Mapping[str, Any]) -> Dict[str, Any]:
        """The spec with its ``workdir`` uploaded and named as ``code``.

        Without ``workdir`` or ``code``, a relative ``entry_point`` that is a file of the
        current folder (``train.py``, as the articles write it) ships that folder: the node
        would not find it otherwise. One that is not here is left to the image."""
        body = dict(spec)
        workdir = body.pop("workdir", None)
        if workdir is None and body.get("code") is None:
            workdir = _entry_point_folder(body.get("entry_point"))
            if workdir is not None:
                stored = self.upload_code(workdir)
                print(
                    f"autodl: {body['entry_point']!r} is in {os.path.abspath(workdir)}: that folder"
                    f" ships with the task ({stored['size_bytes'] / 1e6:.1f} MB; .gitignore and"
                    " .autodlignore apply; give workdir= to choose another)",
                    file=sys.stderr,
                )
                body["code"] = stored["id"]
                return body
        if workdir is not None:
            body["code"] = self.upload_code(workdir)["id"]
        return body

    # Sweeps --------------------------------------------------------------------------

    def submit_sweep(
        self,
        config: Optional[Mapping[str, Any]] = None,
        *,
        parameters: Mapping[str, Any],
        method: str = "grid",
        samples: Optional[int] = None,
        seed: Optional[int] = None,
        max_concurrency: Optional[int] = None,
        name: Optional[str] = None,
        metric: Optional[str] = None,
        mode: Optional[str] = None,
        resource: Optional[str] = None,
        min_resource: Optional[float] = None,
        max_resource: Optional[float] = None,
        reduction_factor: Optional[int] = None,
        **overrides: Any,
    ) -> Sweep:
        """Submits a sweep: a task per trial of ``config`` (a task configuration, as
        :meth:`submit_task` takes, with ``${name}`` where a parameter goes).

        ``method="grid"`` runs every combination of the listed values; ``"random"`` draws
        ``samples`` trials (a list gives one of its values, ``{"min", "max", "log"}`` a number
        in the range; ``seed`` makes the draws repeatable). At most ``max_concurrency`` trials
        run at once. One request, however many trials; all are made or none.

        ``metric`` and ``mode`` (``"min"``, the default, or ``"max"``) name what the sweep
        optimises, for :meth:`Sweep.best`. ``method="asha"`` also stops trials early
        (asynchronous successive halving): trials report ``resource`` (``"step"`` by
        default, or ``"epoch"``) with ``metric`` through ``get_monitor().log``; at rungs
        ``min_resource`` (1), ``min_resource * reduction_factor`` (3), ... up to
        ``max_resource``, a trial whose metric is not among the best ``1/reduction_factor``
        of the trials that reached the rung before it is stopped. Its trials are a grid's, or
        ``samples`` random draws.
        """
        template = self._with_code(build_spec(config, **overrides))
        body: Dict[str, Any] = {
            # A template named "lr-${lr}" names its trials; the sweep is "lr".
            "name": name
            or re.sub(r"[-_ ]*\$\{\w+\}", "", str(template.get("name") or "")).strip()
            or "sweep",
            "template": template,
            "parameters": parameters_body(parameters),
            "method": method,
        }
        for key, value in (
            ("samples", samples),
            ("seed", seed),
            ("max_concurrency", max_concurrency),
            ("metric", metric),
            ("mode", mode),
            ("resource", resource),
            ("min_resource", min_resource),
            ("max_resource", max_resource),
            ("reduction_factor", reduction_factor),
        ):
            if value is not None:
                body[key] = value
        try:
            return Sweep(self, self._http.post("/sweeps", body))
        except ValidationError as exc:
            raise in_users_terms(exc, config, overrides) from exc

    def get_sweep(self, sweep_id: str) -> Sweep:
        """The sweep with each trial's parameters, state and newest metrics."""
        return Sweep(self, self._http.get(f"/sweeps/{quote(str(sweep_id), safe='')}"))

    def list_sweeps(self, limit: int = 50) -> List[Sweep]:
        """Your organization's sweeps, newest first (trials per state, no rows)."""
        return [Sweep(self, s) for s in self._http.get("/sweeps", params={"limit": limit}) or []]

    def upload_code(
        self, workdir: Union[str, os.PathLike[str]], *, max_bytes: int = MAX_BUNDLE_BYTES
    ) -> Dict[str, Any]:
        """Packs ``workdir`` (see :mod:`autodl.workdir` for what is left out) and uploads it
        unless your organization already has the same bundle. Returns ``id`` (the task's
        ``code``), ``size_bytes`` and ``uploaded`` (False when nothing was sent).

        A folder whose files have the same names, sizes and modification times as when it
        was last packed here is not packed again: the bundle it made is asked for by id
        (remembered in ``~/.cache/autodl/workdirs.json``)."""
        folder = Path(workdir)
        files = fp = None
        if folder.is_dir():
            files = collect(folder)
            fp = fingerprint(files)
            cached = cached_bundle(fp)
            if cached is not None:
                try:
                    known = self._http.get(f"/code/{cached}")
                    return {"id": cached, "size_bytes": known["size_bytes"], "uploaded": False}
                except NotFound:
                    pass
        bundle = pack(workdir, max_bytes=max_bytes, files=files)
        if fp is not None:
            remember_bundle(fp, bundle.id)
        try:
            known = self._http.get(f"/code/{bundle.id}")
            return {"id": bundle.id, "size_bytes": known["size_bytes"], "uploaded": False}
        except NotFound:
            pass
        stored = self._http.send_bytes("POST", "/code", bundle.data)
        return {**stored, "uploaded": True}

    def get_task(self, task_id: str) -> Task:
        """The task with this id (:class:`~autodl.errors.NotFound` if not in your
        organization)."""
        return Task(self, self._http.get(f"/tasks/{quote(str(task_id), safe='')}"))

    def tunnel(self, path: str, **params: Any) -> Any:
        """A WebSocket into a running task (``/tasks/{id}/shell``, ``exec`` or
        ``ports/{port}``), checked by the server; see :mod:`autodl.tunnel`."""
        from .tunnel import open_tunnel

        return open_tunnel(self.base_url, self.api_key, path, params)

    def app_url(self, task_id: str, port: int, path: str = "/") -> str:
        """A link that opens a web port the running task declared (JupyterLab, TensorBoard)
        in a browser, on the app's own origin. It carries a ticket good once, for a minute;
        the browser then holds a pass for that app alone, ended when this key is revoked."""
        answer = self._http.get(
            f"/tasks/{quote(str(task_id), safe='')}/ports/{int(port)}/open", params={"path": path}
        )
        return str(answer["url"])

    def exec(
        self,
        task_id: str,
        command: Sequence[str],
        stdin: Optional[Union[str, bytes]] = None,
        rank: Optional[int] = None,
    ) -> ExecResult:
        """Runs ``command`` (an argument list) in a running task's environment, as the task
        runs (its user, sandbox or container, folders and variables), and returns what it
        printed and its exit code. The task's owner and the organization's admins may; each
        call is an event in the task's timeline."""
        import json

        from .tunnel import exec_collect

        argv = [str(a) for a in command]
        if not argv:
            raise ValidationError("command is required, e.g. ['nvidia-smi']", field="command")
        data = stdin.encode() if isinstance(stdin, str) else stdin
        ws = self.tunnel(
            f"/tasks/{quote(str(task_id), safe='')}/exec",
            command=json.dumps(argv),
            rank=rank,
        )
        return exec_collect(ws, data)

    def task(self, task_id: str) -> Task:
        """A handle on a task id without fetching it (the first status read fetches)."""
        return Task(self, {"id": task_id})

    def list_tasks(
        self,
        state: Optional[str] = None,
        label: Any = None,
        user: Optional[str] = None,
        *,
        page_size: int = 50,
        limit: Optional[int] = None,
    ) -> Iterator[Task]:
        """Tasks of your organization, newest first, fetched page by page as you iterate.

        ``state`` is a status in either case (``"RUNNING"``/``"running"``); ``label`` is
        ``"key=value"``, a dict or a list of those; ``user`` is a user id or ``"me"``;
        ``limit`` stops after that many tasks.
        """
        params: List[Tuple[str, Any]] = [("limit", page_size)]
        if state:
            params.append(("state", state.lower()))
        if user:
            params.append(("user", user))
        # The API filters on one label; further ones are checked here on each task's labels.
        labels = list(label_params(label))
        if labels:
            params.append(("label", labels[0]))
        extra = [lab.partition("=")[::2] for lab in labels[1:]]
        cursor: Optional[str] = None
        seen = 0
        while True:
            page_params = params + ([("cursor", cursor)] if cursor else [])
            body = self._http.get("/tasks", params=page_params) or {}
            for info in body.get("items") or []:
                task_labels = (info.get("spec") or {}).get("labels") or {}
                if any(task_labels.get(k) != v for k, v in extra):
                    continue
                yield Task(self, info)
                seen += 1
                if limit is not None and seen >= limit:
                    return
            cursor = body.get("next_cursor")
            if not cursor:
                return

    # Data in object storage ------------------------------------------------------------

    @staticmethod
    def _object_url(url: str) -> Tuple[str, str]:
        """``s3://bucket/path`` -> (bucket, path); paths live in your organization's area."""
        if not isinstance(url, str) or not url.startswith("s3://"):
            raise ValidationError(
                f"url must be an s3://bucket/path URL such as s3://autodl/datasets/mnist, "
                f"got {url!r}",
                field="url",
            )
        bucket, _, path = url[len("s3://") :].partition("/")
        if not bucket:
            raise ValidationError(
                f"url names no bucket: {url!r}; write s3://BUCKET/path, "
                "e.g. s3://autodl/datasets/mnist",
                field="url",
            )
        return bucket, path.strip("/")

    def upload_data(self, local: Union[str, os.PathLike[str]], url: str) -> List[Dict[str, Any]]:
        """Uploads a file, or every file below a folder, to ``url`` (``s3://bucket/path``);
        a task then reads it with ``data_path=url`` (fetched to its node, and cached there).
        Returns what was stored (``path``, ``size``)."""
        bucket, base = self._object_url(url)
        source = Path(local)
        if not source.exists():
            raise ValidationError(
                f"local: {os.fspath(source)!r} does not exist; name a file or a folder to upload",
                field="local",
            )
        if source.is_dir():
            files = sorted(p for p in source.rglob("*") if p.is_file())
            pairs = [(p, f"{base}/{p.relative_to(source).as_posix()}".strip("/")) for p in files]
        else:
            pairs = [(source, base or source.name)]
        stored = []
        for file, key in pairs:
            with open(file, "rb") as fh:
                stored.append(
                    self._http.upload(
                        f"/objects/{quote(bucket, safe='')}/{quote(key, safe='/')}", fh
                    )
                )
        return stored

    def list_data(self, url: str) -> List[Dict[str, Any]]:
        """The objects below ``s3://bucket/path`` in your organization's area."""
        bucket, prefix = self._object_url(url)
        return list(
            self._http.get(f"/objects/{quote(bucket, safe='')}", params={"prefix": prefix}) or []
        )

    def download_data(self, url: str, local: Union[str, os.PathLike[str]]) -> Path:
        """Downloads one object to the file ``local``."""
        bucket, key = self._object_url(url)
        target = Path(local)
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as fh:
            self._http.download(f"/objects/{quote(bucket, safe='')}/{quote(key, safe='/')}", fh)
        return target

    # Cluster and account ---------------------------------------------------------------

    def nodes(self) -> List[Dict[str, Any]]:
        """The cluster's nodes and their GPUs (type, memory, what is allocated)."""
        return list(self._http.get("/nodes") or [])

    def me(self) -> Dict[str, Any]:
        """The authenticated user (``id``, ``email``, ``tenant_id``, ``role``, ...)."""
        me: Dict[str, Any] = self._http.get("/me")
        return me

    def create_api_key(self, name: str, expires_in_days: Optional[int] = None) -> Dict[str, Any]:
        """Creates an API key; the answer's ``key`` is shown only this once."""
        body: Dict[str, Any] = {"name": name}
        if expires_in_days is not None:
            body["expires_in_days"] = expires_in_days
        created: Dict[str, Any] = self._http.post("/api-keys", body)
        return created

    def api_keys(self) -> List[Dict[str, Any]]:
        """Your active API keys (prefix and dates, never the secret)."""
        return list(self._http.get("/api-keys") or [])

    def revoke_api_key(self, key_id: str) -> None:
        """Revokes one of your API keys at once."""
        self._http.delete(f"/api-keys/{quote(str(key_id), safe='')}")


def default_client() -> Client:
    """A client configured from ``AUTODL_API_URL`` / ``AUTODL_API_KEY``, for the helpers
    that accept ``client=None``."""
    return Client()


def _entry_point_folder(entry_point: Any) -> Optional[str]:
    """``"."`` when ``entry_point`` names a script (before its arguments) by a relative path
    that is a file here."""
    if not isinstance(entry_point, str):
        return None
    try:
        script = shlex.split(entry_point)[0]
    except (ValueError, IndexError):
        return None
    if os.path.isabs(script) or not os.path.isfile(script):
        return None
    return "."
