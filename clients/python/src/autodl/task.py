"""A handle on one submitted task: its status, logs, events, metrics and results."""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import (
    TYPE_CHECKING,
    Any,
    Dict,
    Iterable,
    Iterator,
    List,
    Optional,
    Sequence,
    Union,
)
from urllib.parse import quote

from .archive import safe_extract
from .errors import AutodlConnectionError, TaskTimeout

if TYPE_CHECKING:  # pragma: no cover
    from .client import Client
    from .tunnel import ExecResult

PENDING = "PENDING"
SCHEDULED = "SCHEDULED"
RUNNING = "RUNNING"
COMPLETED = "COMPLETED"
FAILED = "FAILED"
CANCELLED = "CANCELLED"
#: A run reached the task's ``time_limit`` and was stopped.
TIMED_OUT = "TIMED_OUT"
FINAL_STATUSES = frozenset({COMPLETED, FAILED, CANCELLED, TIMED_OUT})

_LOG_PAGE = 1000


def status_of(info: Dict[str, Any]) -> str:
    """The SDK's upper-case status for a task document (the API uses lower case)."""
    return str(info.get("state", "")).upper()


class Task:
    """One task on the server.

    ``info`` holds the task document from the last fetch; :meth:`refresh` and
    :meth:`get_status` fetch it again. Statuses are upper case (``"RUNNING"``) as the SDK
    articles use them; the raw document keeps the API's lower-case ``state``.
    """

    def __init__(self, client: Client, info: Dict[str, Any]) -> None:
        self._client = client
        self.info: Dict[str, Any] = info
        self.id: str = str(info["id"])

    def __repr__(self) -> str:
        return f"<Task {self.id} {self.info.get('name')!r} {self.status}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Task) and other.id == self.id

    def __hash__(self) -> int:
        return hash(self.id)

    @property
    def _path(self) -> str:
        return f"/tasks/{quote(self.id, safe='')}"

    @property
    def name(self) -> Optional[str]:
        return self.info.get("name")

    @property
    def number(self) -> Optional[int]:
        """Its number in the organization (``#412``), which ``client.get_task("#412")``,
        the CLI and the web app's URLs accept wherever an id goes."""
        return self.info.get("number")

    @property
    def status(self) -> str:
        """The status as of the last fetch (no request); see :meth:`get_status`."""
        return status_of(self.info)

    @property
    def placement(self) -> Optional[List[Dict[str, Any]]]:
        """Where the task runs (``[{"node", "gpu_indices"}]``), None unless scheduled."""
        return self.info.get("placement")

    @property
    def waiting(self) -> Optional[Dict[str, Any]]:
        """Why a pending task waits (``reason``, ``message``, ``position``,
        ``estimated_start``), else None."""
        return self.info.get("waiting")

    @property
    def estimated_start(self) -> Optional[str]:
        """When the scheduler expects a pending task to start (RFC 3339, UTC), or None: not
        pending, not estimated yet, or beyond the forecast's horizon."""
        return (self.info.get("waiting") or {}).get("estimated_start")

    @property
    def finished(self) -> bool:
        return self.status in FINAL_STATUSES

    @property
    def results_state(self) -> Optional[str]:
        """Where the results stand when they are not simply there, as of the last fetch:
        ``"uploading"`` (the run ended while the server or storage was away; its node keeps
        them and uploads them) or ``"lost"`` (they could not be kept; :meth:`events` says
        why). None otherwise."""
        return self.info.get("results")

    def refresh(self) -> Task:
        """Fetches the task document again; returns self for chaining."""
        self.info = self._client._http.get(self._path)
        return self

    def get_status(self) -> str:
        """The current status, fetched now: one of PENDING, SCHEDULED, RUNNING, COMPLETED,
        FAILED, CANCELLED, TIMED_OUT."""
        return self.refresh().status

    def wait(
        self, timeout: Optional[float] = None, poll: float = 1.0, results: bool = True
    ) -> str:
        """Blocks until the task is finished and returns its final status.

        With ``results`` (the default), a task that ended while its results were still
        uploading from its node (:attr:`results_state`) is waited for until they are stored
        or given up, so :meth:`download_results` can follow.

        Raises :class:`~autodl.errors.TaskTimeout` when ``timeout`` seconds pass first.
        Transient connection failures are retried until the deadline, since a long wait
        should survive a server restart.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                status = self.get_status()
                uploading = results and self.results_state == "uploading"
                if status in FINAL_STATUSES and not uploading:
                    return status
            except AutodlConnectionError:
                if deadline is not None and time.monotonic() >= deadline:
                    raise
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                still = self.status
                if self.results_state == "uploading":
                    still += " with its results uploading"
                raise TaskTimeout(f"task {self.id} is still {still} after {timeout:g} s")
            sleep = poll if deadline is None else max(0.0, min(poll, deadline - now))
            time.sleep(sleep)

    def exec(self, command: Sequence[str], stdin: Optional[Union[str, bytes]] = None) -> ExecResult:
        """Runs ``command`` inside this running task (see :meth:`autodl.Client.exec`)."""
        return self._client.exec(self.id, command, stdin=stdin)

    def cancel(self) -> str:
        """Cancels the task and returns its new status; a finished task raises
        :class:`~autodl.errors.Conflict`."""
        self.info = self._client._http.post(f"{self._path}/cancel")
        return self.status

    def export(self) -> Dict[str, Any]:
        """The request that submits this task again as it was (``Client.submit_spec`` takes
        it): what ``autodl export``, ``clone`` and ``retry`` send."""
        return dict(self._client._http.get(f"{self._path}/spec") or {})

    def events(self) -> List[Dict[str, Any]]:
        """The task's history: ``[{"at", "kind", "message"}]``, oldest first."""
        return list(self._client._http.get(f"{self._path}/events") or [])

    def attempts(self) -> List[Dict[str, Any]]:
        """Each run of the task: node, GPUs, times, exit code, end reason, batch size."""
        return list(self._client._http.get(f"{self._path}/attempts") or [])

    def metrics(self, after: Optional[str] = None) -> List[Dict[str, Any]]:
        """Metric samples (``at``, ``gpu_util``, ``mem_used``, ``mem_total``, ``epoch``,
        ``loss``, ``values``), optionally only those after an RFC 3339 time."""
        params = {"after": after} if after else None
        body = self._client._http.get(f"{self._path}/metrics", params=params) or {}
        return list(body.get("samples") or [])

    def log_records(self, after: int = 0) -> Iterator[Dict[str, Any]]:
        """Stored log records (``seq``, ``at``, ``stream``, ``line``) after ``after``, page by
        page."""
        cursor = after
        while True:
            body = (
                self._client._http.get(
                    f"{self._path}/logs", params={"after": cursor, "limit": _LOG_PAGE}
                )
                or {}
            )
            lines = body.get("lines") or []
            yield from lines
            next_after = body.get("next_after")
            if not lines or next_after is None or next_after == cursor:
                return
            cursor = next_after

    def logs(
        self,
        follow: bool = False,
        after: int = 0,
        markers: bool = False,
        rank: Optional[int] = None,
    ) -> Union[List[str], Iterator[str]]:
        """The task's output lines, stdout and stderr in the order they were written.

        ``follow=False`` returns the lines stored so far as a list. ``follow=True`` returns an
        iterator that yields lines as they are written (Server-Sent Events) and ends when the
        task finishes; it resumes after a dropped connection without repeating lines. With
        ``markers``, a line ``── attempt N ──`` starts each retried run and lines of a task
        with several workers start with ``[rank R]`` (as ``autodl logs`` prints them).
        ``rank`` keeps the lines of that worker alone.
        """
        records = self._follow_records(after) if follow else self.log_records(after)
        if rank is not None:
            records = (r for r in records if r.get("rank") == rank)
        if follow:
            return _marked(records, markers)
        return list(_marked(records, markers))

    def _follow_records(self, after: int) -> Iterator[Dict[str, Any]]:
        cursor = after
        retries = 0
        while True:
            try:
                for event, record in self._client._http.sse(
                    f"{self._path}/logs/stream", params={"after": cursor}
                ):
                    if event == "end":
                        return
                    retries = 0
                    seq = record.get("seq")
                    if isinstance(seq, int):
                        if seq <= cursor:
                            continue
                        cursor = seq
                    if "line" in record:
                        yield record
                return  # the server ends the stream when the task is finished
            except AutodlConnectionError:
                retries += 1
                if retries > 5:
                    raise
                time.sleep(min(2.0**retries, 15.0))

    def checkpoints(self) -> List[Dict[str, Any]]:
        """The task's saved checkpoints, newest first (``id``, ``attempt``, ``step``,
        ``epoch``, ``files``, ``size_bytes``, ``created_at``, ``location``)."""
        return list(self._client._http.get(f"{self._path}/checkpoints") or [])

    def download_results(self, path: Union[str, os.PathLike[str]] = "./output") -> Path:
        """Downloads the results archive (a tar of the files the task left in
        ``AUTODL_RESULTS_DIR``) and extracts it into ``path`` (created if needed);
        returns that directory. Members that would land outside it are refused
        (:class:`~autodl.errors.UnsafeArchive`) before anything is written. A task without
        results raises :class:`~autodl.errors.NotFound` (code ``no_results``); one whose
        results are still uploading from its node raises :class:`~autodl.errors.Conflict`
        (:meth:`wait` waits for them)."""
        dest = Path(path)
        fd, tmp_name = tempfile.mkstemp(prefix="autodl-results-", suffix=".tar")
        try:
            with os.fdopen(fd, "wb") as fh:
                self._client._http.download(f"{self._path}/results", fh)
            return safe_extract(tmp_name, dest)
        finally:
            try:
                os.unlink(tmp_name)
            except OSError:
                pass


def _marked(records: Iterable[Dict[str, Any]], markers: bool) -> Iterator[str]:
    """Log records as text, with attempt separators and rank prefixes when asked."""
    attempt = 1
    for r in records:
        line = str(r.get("line", ""))
        if markers:
            this = r.get("attempt") or attempt
            if this != attempt:
                attempt = this
                yield f"── attempt {attempt} ──"
            if r.get("rank") is not None:
                line = f"[rank {r['rank']}] {line}"
        yield line
