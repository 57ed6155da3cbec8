"""AutoBatch with fake memory probes and a fake clock: no GPU and no torch needed."""

import pytest

from autodl.optim import AutoBatch

GIB = 2**30
TOTAL = 40 * GIB


class FakeClock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


class Loader:
    """Resizable like a loader with a writable ``batch_size``; loading a batch takes
    ``load_time`` fake seconds."""

    def __init__(self, clock, batch_size=16, batches=10_000, load_time=0.001):
        self.clock, self.batch_size, self.batches, self.load_time = (
            clock,
            batch_size,
            batches,
            load_time,
        )

    def __len__(self):
        return self.batches

    def __iter__(self):
        for _ in range(self.batches):
            self.clock.t += self.load_time
            yield [0] * self.batch_size


def memory(ab_ref, base=2 * GIB, per_sample=0.1 * GIB, total=TOTAL):
    """A probe whose usage is linear in the current batch size."""
    return lambda: (int(total - (base + per_sample * ab_ref[0].batch_size)), total)


def run(ab, clock, steps, step_time=0.01, on_step=None):
    """Trains ``steps`` steps; AutoBatch counts a step as done when the next batch is asked
    for, so the loop asks for one more batch and stops before using it."""
    sizes = []
    for i, batch in enumerate(ab):
        if i >= steps:
            break
        sizes.append(len(batch))
        clock.t += step_time
        if on_step:
            on_step(i, ab)
    return sizes


@pytest.fixture(autouse=True)
def no_task_env(monkeypatch):
    for name in ("AUTODL_BATCH_SIZE", "AUTODL_ATTEMPT"):
        monkeypatch.delenv(name, raising=False)


def make(clock, loader=None, probe_kw=None, **kw):
    ref = []
    kw.setdefault("memory_probe", memory(ref, **(probe_kw or {})))
    ab = AutoBatch(loader if loader is not None else Loader(clock), clock=clock, **kw)
    ref.append(ab)
    return ab


def used_fraction(bs, base=2 * GIB, per=0.1 * GIB):
    return (base + per * bs) / TOTAL


def test_grows_when_memory_is_free_and_loader_fast_but_keeps_the_margin():
    clock = FakeClock()
    ab = make(clock, max_batch=1024, safety_margin=0.2, warmup=100)
    assert ab.batch_size == 16
    sizes = run(ab, clock, 2000)
    assert ab.batch_size > 200
    assert max(sizes) == ab.batch_size
    # (2 GiB + 0.1 GiB * bs) must stay within 80% of 40 GiB: bs <= 300
    assert all(used_fraction(s) <= 0.8 for s in sizes)
    assert 295 <= ab.batch_size <= 300
    grows = [h for h in ab.history if h.changed]
    assert grows and all(h.new > h.old for h in grows)
    assert all(h.reason.startswith("grow") for h in grows)


def test_never_exceeds_max_batch():
    clock = FakeClock()
    ab = make(clock, max_batch=64, warmup=10)
    sizes = run(ab, clock, 500)
    assert max(sizes) == 64 and ab.batch_size == 64
    assert ab.history[-1].reason == "at limit"


def test_no_change_during_warmup_then_every_interval():
    clock = FakeClock()
    ab = make(clock, warmup=100)
    sizes = run(ab, clock, 100)
    assert set(sizes) == {16} and len(ab.history) == 1 and ab.history[0].iteration == 100
    run(ab, clock, 100)
    assert [h.iteration for h in ab.history] == [100, 200]


def test_shrinks_near_the_memory_limit_and_stays_below_the_margin():
    clock = FakeClock()
    probe_kw = {"per_sample": 0.18 * GIB}
    ab = make(
        clock,
        Loader(clock, batch_size=200),
        probe_kw=probe_kw,
        max_batch=256,
        safety_margin=0.2,
        warmup=50,
    )
    assert ab.batch_size == 200  # starts at the loader's own size
    run(ab, clock, 1000)
    shrinks = [h for h in ab.history if h.changed]
    assert shrinks[0].reason == "memory near limit" and shrinks[0].new < 200
    assert all(h.new < h.old for h in shrinks)
    assert (2 + 0.18 * ab.batch_size) / 40 <= 0.8
    assert ab.batch_size >= 160  # it does not overshoot downwards either (limit is 166)


def test_respects_a_larger_safety_margin():
    clock = FakeClock()
    ab = make(clock, max_batch=1024, safety_margin=0.5, warmup=20)
    sizes = run(ab, clock, 1000)
    assert all(used_fraction(s) <= 0.5 for s in sizes)
    assert 175 <= ab.batch_size <= 180


def test_holds_while_the_loader_is_the_bottleneck():
    clock = FakeClock()
    ab = make(clock, Loader(clock, load_time=0.05), warmup=20)
    run(ab, clock, 200, step_time=0.01)
    assert ab.batch_size == 16
    assert ab.history[-1].reason == "loader is the bottleneck"
    assert ab.history[-1].data_wait_fraction > 0.8


def test_unstable_gradients_shrink():
    clock = FakeClock()
    ab = make(clock, Loader(clock, batch_size=64), warmup=20)
    run(ab, clock, 20, on_step=lambda i, a: a.observe(loss=float("nan") if i == 10 else 1.0))
    assert ab.batch_size == 32 and ab.history[-1].reason == "unstable gradients"

    clock = FakeClock()
    ab = make(clock, Loader(clock, batch_size=64), warmup=30)
    run(ab, clock, 30, on_step=lambda i, a: a.observe(loss=1.0 + 0.2 * i))  # climbing loss
    assert ab.batch_size == 32


def test_noisy_gradients_grow_faster():
    def noisy(i, a):
        a.observe(loss=1.0, grad_norm=1.0 if i % 2 else 3.0)

    def calm(i, a):
        a.observe(loss=1.0, grad_norm=1.0 + 0.001 * (i % 2))

    grown = {}
    for name, feed in (("noisy", noisy), ("calm", calm)):
        clock = FakeClock()
        ab = make(clock, Loader(clock, batch_size=32), warmup=20)
        run(ab, clock, 20, on_step=feed)
        grown[name] = ab.batch_size
        assert ab.history[-1].gradient_noise is not None
    assert grown == {"noisy": 64, "calm": 48}


def test_oom_retry_caps_at_autodl_batch_size(monkeypatch):
    monkeypatch.setenv("AUTODL_BATCH_SIZE", "32")
    monkeypatch.setenv("AUTODL_ATTEMPT", "2")
    clock = FakeClock()
    ab = make(clock, Loader(clock, batch_size=128), max_batch=256, warmup=10)
    assert ab.batch_size == 32 and ab.max_batch == 32
    sizes = run(ab, clock, 300)
    assert max(sizes) <= 32


def test_first_attempt_starts_at_autodl_batch_size_and_may_grow(monkeypatch):
    monkeypatch.setenv("AUTODL_BATCH_SIZE", "24")
    clock = FakeClock()
    ab = make(clock, Loader(clock, batch_size=128), max_batch=256, warmup=10)
    assert ab.batch_size == 24
    run(ab, clock, 100)
    assert ab.batch_size > 24


def test_factory_protocol_resizes_at_the_next_epoch():
    clock = FakeClock()
    calls = []

    def factory(bs):
        calls.append(bs)
        return Loader(clock, batch_size=bs, batches=30)

    ab = make(clock, factory, warmup=20, initial_batch=8, max_batch=100)
    epoch1 = run(ab, clock, 10_000)
    assert set(epoch1) == {8}  # the size changed after 20 steps but this epoch keeps its loader
    assert ab.batch_size == 12
    epoch2 = run(ab, clock, 10_000)
    assert set(epoch2) == {12} and calls == [8, 12]
    assert len(ab) == 30


def test_a_size_waiting_for_the_next_epoch_is_not_measured_before_it_runs():
    """A factory's loader keeps its size for the epoch: readings taken meanwhile are of the
    batches actually built, and growth waits until the new size runs and is measured."""
    clock = FakeClock()
    built = {"bs": 0}

    def factory(bs):
        built["bs"] = bs
        return Loader(clock, batch_size=bs, batches=300)

    def probe():  # usage follows the batches built, not the recommendation
        return int(TOTAL - (2 * GIB + 0.1 * GIB * built["bs"])), TOTAL

    ab = AutoBatch(
        factory,
        clock=clock,
        memory_probe=probe,
        warmup=20,
        initial_batch=16,
        max_batch=4096,
        safety_margin=0.2,
    )
    assert set(run(ab, clock, 10_000)) == {16}
    assert ab.batch_size == 24, ab.history  # one step up, then it waits for the next epoch
    assert all(a.new == 24 for a in ab.history[1:]), ab.history
    for _ in range(8):
        sizes = run(ab, clock, 10_000)
        assert len(set(sizes)) == 1
        assert used_fraction(sizes[0]) <= 0.8 + 1e-9, (sizes[0], ab.history[-3:])
    # It reaches the memory budget: (0.8 * 40 GiB - 2 GiB) / 0.1 GiB per sample = 300.
    assert 290 <= built["bs"] <= 300, built


def test_factory_can_resize_mid_epoch():
    clock = FakeClock()
    calls = []

    def factory(bs):
        calls.append(bs)
        return Loader(clock, batch_size=bs)

    ab = make(clock, factory, warmup=20, initial_batch=8, resize_mid_epoch=True)
    sizes = run(ab, clock, 41)
    assert sizes[19] == 8 and sizes[20] == 12 and sizes[40] == 18
    assert calls == [8, 12, 18]


def test_torch_style_batch_sampler_is_resized_in_place():
    clock = FakeClock()

    class Sampler:
        batch_size = 16

    class DataLoaderLike:
        """Like torch's DataLoader: batch_size cannot be set, the batch sampler's can."""

        def __init__(self):
            self.batch_sampler = Sampler()
            self.dataset = "the dataset"

        @property
        def batch_size(self):
            return 16

        def __iter__(self):
            while True:
                clock.t += 0.001
                yield [0] * self.batch_sampler.batch_size

    loader = DataLoaderLike()
    ab = make(clock, loader, warmup=10)
    run(ab, clock, 11)
    assert loader.batch_sampler.batch_size == ab.batch_size == 24
    assert ab.dataset == "the dataset"  # attribute access reaches the wrapped loader


def test_plain_iterables_get_a_recommendation_and_a_warning():
    clock = FakeClock()
    batches = ([0] * 16 for _ in range(100))
    ab = make(clock, batches, warmup=10, initial_batch=16)
    with pytest.warns(RuntimeWarning, match="cannot be resized"):
        sizes = run(ab, clock, 50)
    assert set(sizes) == {16} and ab.batch_size > 16


def test_without_memory_information_it_grows_to_max_batch():
    clock = FakeClock()
    ab = AutoBatch(Loader(clock), max_batch=100, warmup=10, memory_probe=None, clock=clock)
    run(ab, clock, 200)
    assert ab.batch_size == 100


def test_default_probe_without_torch_or_cuda_is_harmless():
    clock = FakeClock()
    ab = AutoBatch(Loader(clock), max_batch=40, warmup=5, clock=clock)  # "auto" probe
    run(ab, clock, 50)
    assert ab.batch_size == 40


def test_on_oom_halves_and_never_returns_above():
    clock = FakeClock()
    ab = make(clock, Loader(clock, batch_size=128), warmup=10, max_batch=256)
    assert ab.on_oom() == 64
    run(ab, clock, 500)
    assert ab.batch_size <= 127
    assert ab.history[0].reason == "oom"


def test_a_failing_probe_is_dropped_with_a_warning():
    clock = FakeClock()

    def broken():
        raise RuntimeError("nvml gone")

    ab = AutoBatch(Loader(clock), max_batch=64, warmup=5, memory_probe=broken, clock=clock)
    with pytest.warns(RuntimeWarning, match="nvml gone"):
        run(ab, clock, 20)
    assert ab.batch_size > 16


@pytest.mark.parametrize(
    "kw", [{"max_batch": 0}, {"safety_margin": 1.0}, {"safety_margin": -0.1}, {"warmup": -1}]
)
def test_argument_checks(kw):
    with pytest.raises(ValueError):
        AutoBatch([], **kw)
