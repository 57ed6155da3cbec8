"""Adaptive batch size: :class:`AutoBatch` wraps a data loader and resizes its batches.

Every ``interval`` iterations (100 by default, after ``warmup`` iterations during which
nothing changes) it looks at three signals gathered over the last window:

(a) **GPU memory** -- the smallest free memory seen (``torch.cuda.mem_get_info`` with the
    process's peak allocation when torch and CUDA are present, or any *memory probe* you
    pass). The batch shrinks when usage exceeds ``1 - safety_margin`` of the card and may
    grow only as far as the predicted usage stays under it. The prediction is linear in the
    batch size, fitted from two batch sizes once seen (before that, usage is assumed
    proportional to the batch size, which overestimates growth cost: the safe side).
(b) **data loading latency** -- the share of the step spent waiting for the loader. When
    the loader is the bottleneck (``loader_bound`` share, 30% by default), a bigger batch
    would only make the GPU wait longer, so the size is held.
(c) **gradient stability** -- from ``observe(loss=..., grad_norm=...)`` calls: a non-finite
    or diverging loss/gradient norm halves the batch; noisy gradients (high step-to-step
    variation) make it grow faster, since a larger batch averages the noise out.

The batch never exceeds ``max_batch`` (nor ``AUTODL_BATCH_SIZE`` on a retried attempt, which
the platform halves after an out-of-memory failure) and never goes below 1.

Loader protocol -- ``loader`` may be:

* a **callable** ``factory(batch_size) -> iterable of batches`` (e.g.
  ``lambda bs: DataLoader(ds, batch_size=bs, shuffle=True)``). It is called at the start of
  each epoch with the current size; with ``resize_mid_epoch=True`` it is called again as soon
  as the size changes (right for endless or streaming data). Until a new size reaches the
  batches, readings count for the size still running and the batch does not grow further.
* an iterable whose size can be changed in place, tried in this order: a
  ``set_batch_size(n)`` method, a ``batch_sampler.batch_size`` attribute (a PyTorch
  ``DataLoader``; the change shows after the batches already prefetched by workers), or a
  writable ``batch_size`` attribute. The change applies to the next batches built.
* any other iterable of batches: it is passed through unchanged; AutoBatch still measures
  and records its recommendation in :attr:`AutoBatch.batch_size` and :attr:`history` (and
  warns once that it cannot apply it).
"""

from __future__ import annotations

import math
import statistics
import time
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from . import env as _env

#: ``() -> (free_bytes, total_bytes)`` of the GPU, or None when unknown.
MemoryProbe = Callable[[], Optional[Tuple[int, int]]]

_AUTO = "auto"


def torch_memory_probe() -> Optional[MemoryProbe]:
    """A probe for the current CUDA device, or None without torch or CUDA.

    Free memory is what this process could still use: the card's total minus what other
    processes hold (``mem_get_info``) minus this process's peak allocation since the last
    probe. PyTorch's caching allocator keeps freed blocks reserved, so raw free memory would
    never rise after a shrink; the peak-allocated counter does.
    """
    try:
        import torch  # type: ignore[import-not-found]
    except ImportError:
        return None
    try:
        if not torch.cuda.is_available():
            return None
    except Exception:  # pragma: no cover - broken CUDA installs
        return None

    def probe() -> Optional[Tuple[int, int]]:  # pragma: no cover - needs a GPU
        free, total = torch.cuda.mem_get_info()
        reserved = torch.cuda.memory_reserved()
        peak = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        others = max(0, total - free - reserved)
        return max(0, total - others - peak), total

    return probe


@dataclass(frozen=True)
class Adjustment:
    """One evaluation: the size before and after, why, and the signals it saw."""

    iteration: int
    old: int
    new: int
    reason: str
    memory_used_fraction: Optional[float]
    data_wait_fraction: Optional[float]
    gradient_noise: Optional[float]

    @property
    def changed(self) -> bool:
        return self.old != self.new


@dataclass
class _Window:
    wait: float = 0.0
    compute: float = 0.0
    min_free: Optional[int] = None
    total: Optional[int] = None
    losses: List[float] = field(default_factory=list)
    grad_norms: List[float] = field(default_factory=list)


def _noise(values: List[float]) -> Optional[float]:
    """Step-to-step variation relative to the level: std of successive differences over
    sqrt(2) times the mean magnitude; insensitive to the slow downward trend of a loss."""
    if len(values) < 5:
        return None
    level = statistics.fmean(abs(v) for v in values)
    if level <= 0:
        return None
    diffs = [b - a for a, b in zip(values, values[1:])]
    return statistics.pstdev(diffs) / (math.sqrt(2.0) * level)


def _diverging(values: List[float], factor: float) -> bool:
    """The last third's median exceeds the first third's by ``factor``."""
    if len(values) < 6:
        return False
    third = len(values) // 3
    first = statistics.median(values[:third])
    last = statistics.median(values[-third:])
    return first > 0 and last > first * factor


class AutoBatch:
    """Wraps a data loader and adapts its batch size while you iterate over it.

    ``for batch in AutoBatch(loader, max_batch=256, safety_margin=0.2, warmup=100)`` needs no
    other change to the training loop; call :meth:`observe` with the loss and gradient norm
    to let gradient stability steer it too, and :meth:`on_oom` after catching an
    out-of-memory error to halve the size and never go back above it. See the module
    documentation for the loader protocol.

    The starting size is ``initial_batch``, else ``AUTODL_BATCH_SIZE`` (what the task was
    submitted with, halved by the platform after an OOM), else the loader's own batch size,
    else 32. ``interval`` (default ``warmup``) is the number of iterations between
    evaluations; ``loader_bound`` the share of step time spent waiting for data above which
    growth stops; ``growth``/``noisy_growth`` the growth factors for calm/noisy gradients;
    ``divergence_factor`` how much the loss may climb within a window before the batch is
    halved; ``clock`` and ``memory_probe`` are injectable for tests and non-CUDA devices.
    """

    def __init__(
        self,
        loader: Union[Iterable[Any], Callable[[int], Iterable[Any]]],
        max_batch: int = 256,
        safety_margin: float = 0.2,
        warmup: int = 100,
        *,
        interval: Optional[int] = None,
        initial_batch: Optional[int] = None,
        min_batch: int = 1,
        memory_probe: Union[MemoryProbe, None, str] = _AUTO,
        loader_bound: float = 0.3,
        growth: float = 1.5,
        noisy_growth: float = 2.0,
        noise_threshold: float = 0.5,
        divergence_factor: float = 1.5,
        resize_mid_epoch: bool = False,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        if not 0.0 <= safety_margin < 1.0:
            raise ValueError("safety_margin must be in [0, 1)")
        if warmup < 0:
            raise ValueError("warmup must be >= 0")
        self._loader = loader
        self._factory: Optional[Callable[[int], Iterable[Any]]] = (
            loader if callable(loader) and not hasattr(loader, "__iter__") else None
        )
        self.safety_margin = float(safety_margin)
        self.warmup = int(warmup)
        self.interval = int(interval or warmup or 100)
        self.min_batch = max(1, int(min_batch))
        self.loader_bound = loader_bound
        self.growth = growth
        self.noisy_growth = noisy_growth
        self.noise_threshold = noise_threshold
        self.divergence_factor = divergence_factor
        self.resize_mid_epoch = resize_mid_epoch
        self._clock = clock
        self._probe: Optional[MemoryProbe] = (
            torch_memory_probe() if memory_probe == _AUTO else memory_probe  # type: ignore[assignment]
        )

        # On a retried attempt the platform's AUTODL_BATCH_SIZE is already reduced after an
        # out-of-memory failure: it caps the size so the retry does not OOM again.
        env_batch = _env.current.batch_size
        self.max_batch = int(max_batch)
        if env_batch and _env.current.attempt > 1:
            self.max_batch = min(self.max_batch, env_batch)
        start = initial_batch or env_batch or self._loader_batch_size() or min(32, self.max_batch)
        self._batch_size = self._clamp(int(start))
        self._ceiling = self.max_batch
        self._iteration = 0
        self._window = _Window()
        self._memory_points: Dict[int, int] = {}
        self._pending_restart = False
        self._warned_fixed = False
        self.history: List[Adjustment] = []
        # The size the batches being trained on were built with: a factory's loader keeps its
        # size until the next epoch (or restart), so readings are of this size, not of the
        # recommendation.
        self._running = self._loader_batch_size() or self._batch_size
        own = self._loader_batch_size()
        if own is not None and own != self._batch_size:
            self._apply(self._batch_size)

    # Public state ----------------------------------------------------------------------

    @property
    def batch_size(self) -> int:
        """The current batch size (the one the next batches are built with, where the loader
        can be resized)."""
        return self._batch_size

    @property
    def iteration(self) -> int:
        """Steps completed so far, across epochs."""
        return self._iteration

    def __len__(self) -> int:
        source = self._factory(self._batch_size) if self._factory else self._loader
        return len(source)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # Training code that reads ``loader.dataset`` keeps working after wrapping.
        loader = self.__dict__.get("_loader")
        if loader is None or self.__dict__.get("_factory") is not None:
            raise AttributeError(name)
        return getattr(loader, name)

    def observe(self, loss: Optional[float] = None, grad_norm: Optional[float] = None) -> None:
        """Feeds this step's loss and/or gradient norm (plain numbers or 0-d tensors)."""
        if loss is not None:
            self._window.losses.append(float(loss))
        if grad_norm is not None:
            self._window.grad_norms.append(float(grad_norm))

    def on_oom(self) -> int:
        """Halves the batch after an out-of-memory error and never returns above the size
        that failed; returns the new size."""
        old, failed = self._batch_size, self._running
        self._ceiling = min(self._ceiling, max(self.min_batch, failed - 1))
        new = self._clamp(failed // 2)
        self._record(old, new, "oom", None, None, None)
        self._window = _Window()
        return new

    # Iteration ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Any]:
        # A step is done when the next batch is asked for: the time since the last batch
        # was handed out is the step's compute, the time inside next() is data wait.
        iterator = self._new_iterator()
        handed_out: Optional[float] = None
        while True:
            requested = self._clock()
            if handed_out is not None:
                self._window.compute += requested - handed_out
                self._step_done()
                if self._pending_restart:
                    self._pending_restart = False
                    iterator = self._new_iterator()
                requested = self._clock()
            try:
                batch = next(iterator)
            except StopIteration:
                return
            handed_out = self._clock()
            self._window.wait += handed_out - requested
            yield batch

    def _new_iterator(self) -> Iterator[Any]:
        if self._factory is None:
            return iter(self._loader)  # type: ignore[arg-type]
        if self._running != self._batch_size:
            # Readings so far were of the old size; the new one starts with a clean window.
            self._running = self._batch_size
            self._window = _Window()
        return iter(self._factory(self._batch_size))

    def _step_done(self) -> None:
        self._iteration += 1
        self._sample_memory()
        if (
            self._iteration >= max(self.warmup, 1)
            and (self._iteration - self.warmup) % self.interval == 0
        ):
            self._evaluate()

    def _sample_memory(self) -> None:
        if self._probe is None:
            return
        try:
            reading = self._probe()
        except Exception as exc:  # a failing probe must not stop training
            warnings.warn(
                f"AutoBatch: memory probe failed ({exc}); ignoring memory",
                RuntimeWarning,
                stacklevel=2,
            )
            self._probe = None
            return
        if not reading:
            return
        free, total = int(reading[0]), int(reading[1])
        if total <= 0:
            return
        w = self._window
        w.total = total
        w.min_free = free if w.min_free is None else min(w.min_free, free)

    # Decision ----------------------------------------------------------------------------

    def _clamp(self, n: int) -> int:
        upper = min(self.max_batch, getattr(self, "_ceiling", self.max_batch))
        return max(self.min_batch, min(int(n), upper))

    def _memory_cap(self, bs: int, used: int, budget: float) -> int:
        """The largest batch whose predicted peak usage stays within ``budget``."""
        self._memory_points[bs] = used
        if len(self._memory_points) >= 2:
            sizes = list(self._memory_points)[-2:]
            (b1, u1), (b2, u2) = [(s, self._memory_points[s]) for s in sizes]
            if b1 != b2:
                per_sample = (u2 - u1) / (b2 - b1)
                if per_sample > 0:
                    base = u1 - per_sample * b1
                    return max(0, int((budget - base) // per_sample))
        if used <= 0:
            return self.max_batch
        return int(bs * budget // used)

    def _evaluate(self) -> None:
        w, self._window = self._window, _Window()
        old = self._batch_size
        running = self._running
        busy = w.wait + w.compute
        data_fraction = w.wait / busy if busy > 0 else None

        mem_fraction: Optional[float] = None
        mem_cap: Optional[int] = None
        if w.total and w.min_free is not None:
            used = max(0, w.total - w.min_free)
            budget = w.total * (1.0 - self.safety_margin)
            mem_fraction = used / w.total
            # Re-inserting keeps the dict ordered by recency for the linear fit.
            self._memory_points.pop(running, None)
            mem_cap = self._memory_cap(running, used, budget)

        series = w.grad_norms if len(w.grad_norms) >= 5 else w.losses
        noise = _noise([v for v in series if math.isfinite(v)])
        unstable = any(not math.isfinite(v) for v in w.losses + w.grad_norms) or any(
            _diverging([v for v in s if math.isfinite(v)], self.divergence_factor)
            for s in (w.losses, w.grad_norms)
        )

        new, reason = old, "hold"
        if unstable:
            new, reason = running // 2, "unstable gradients"
        elif mem_cap is not None and mem_cap < running:
            new, reason = mem_cap, "memory near limit"
            self._ceiling = min(self._ceiling, max(self.min_batch, running - 1))
        elif running != old:
            # The last change has not reached the batches yet: nothing measured says how it
            # behaves, so no further growth (a lower cap from memory still applies).
            if mem_cap is not None and mem_cap < old:
                new = max(running, mem_cap)
            reason = f"waiting for batch size {old} to take effect (batches are {running})"
        elif data_fraction is not None and data_fraction > self.loader_bound:
            reason = "loader is the bottleneck"
        else:
            cap = min(
                self.max_batch, self._ceiling, mem_cap if mem_cap is not None else self.max_batch
            )
            if cap > old:
                noisy = noise is not None and noise > self.noise_threshold
                factor = self.noisy_growth if noisy else self.growth
                new = min(cap, max(old + 1, int(old * factor)))
                reason = "grow (noisy gradients)" if noisy else "grow"
            else:
                reason = "at limit"
        new = self._clamp(new)
        self._record(old, new, reason, mem_fraction, data_fraction, noise)

    def _record(
        self,
        old: int,
        new: int,
        reason: str,
        mem_fraction: Optional[float],
        data_fraction: Optional[float],
        noise: Optional[float],
    ) -> None:
        self.history.append(
            Adjustment(self._iteration, old, new, reason, mem_fraction, data_fraction, noise)
        )
        if new != old:
            self._batch_size = new
            self._apply(new)

    def _apply(self, n: int) -> None:
        """Passes the new size to the loader (see the loader protocol)."""
        if self._factory is not None:
            self._pending_restart = self.resize_mid_epoch
            return
        loader = self._loader
        setter = getattr(loader, "set_batch_size", None)
        if callable(setter):
            setter(n)
            self._running = n
            return
        sampler = getattr(loader, "batch_sampler", None)
        if sampler is not None and hasattr(sampler, "batch_size"):
            sampler.batch_size = n
            self._running = n
            return
        if hasattr(loader, "batch_size"):
            try:
                loader.batch_size = n
                self._running = n
                return
            except (AttributeError, ValueError):
                pass
        if not self._warned_fixed:
            warnings.warn(
                "AutoBatch: this loader cannot be resized; pass a factory "
                "(batch_size -> loader) to apply the recommended batch size",
                RuntimeWarning,
                stacklevel=2,
            )
            self._warned_fixed = True

    def _loader_batch_size(self) -> Optional[int]:
        if self.__dict__.get("_factory") is not None:
            return None
        loader = self._loader
        sampler = getattr(loader, "batch_sampler", None)
        for owner in (sampler, loader):
            size = getattr(owner, "batch_size", None)
            if isinstance(size, int) and size > 0:
                return size
        return None


__all__ = ["AutoBatch", "Adjustment", "MemoryProbe", "torch_memory_probe"]
