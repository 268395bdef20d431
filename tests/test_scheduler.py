"""Continuous batching: images join and leave a running batch at cycle boundaries and keep their exact state;
the scheduler merges concurrent requests, and cancellation, timeouts and a full queue behave as documented."""
import threading
import time
from concurrent.futures import CancelledError, ThreadPoolExecutor

import pytest
import torch

from vvs.runtime.autoregression import AutoRegression
from vvs.runtime.decode import Decoding
from vvs.runtime.speculation import Speculation
from vvs.runtime.loops import run, start
from vvs.runtime.scheduler import Busy, RequestTimeout

MODES = [("ar", {}), ("sd", {}), ("lantern", {}), ("vvs", {"skip_policy": "uniform", "skip_interval": 2}),
         ("vvs", {"skip_policy": "dynamic", "sim_threshold": 0.3}), ("sjd", {"window": 5}),
         ("sjd-pac", {"window": 9, "pac_tree_width": 2, "pac_tree_depth": 3}), ("gsd", {"window": 5, "gsd_distance": 4.0, "gsd_prob_gap": 1.0})]


def _alone(pipe, opts, condition, seed, mask=None):
    d = Decoding(pipe.engines, condition, opts, [seed], mask)
    tokens, stats = run(start(d))
    pipe.engines.release(d.leases)
    return tokens[0], stats[0]


@pytest.mark.parametrize("mode,options", MODES)
@pytest.mark.parametrize("model_type", ["c2i", "t2i"])
def test_images_that_join_and_leave_keep_their_tokens_and_counts(pipeline_factory, mode, options, model_type):
    """A batch runs three cycles, a second batch joins it, one image leaves two cycles later: the images that
    stay end with the tokens and forward counts they get alone."""
    pipe = pipeline_factory(model_type=model_type)
    opts = pipe.options_for(mode, temperature=1.0, top_p=0.8, cfg_scale=2.0, **options)
    if model_type == "c2i":
        conditions, masks = torch.tensor([3, 7, 1]), None
    else:
        conditions = torch.randn(3, 3, 8, generator=torch.Generator().manual_seed(0))
        masks = torch.tensor([[False, True, True], [True, True, True], [False, False, True]])

    def part(images, seeds):
        mask = None if masks is None else masks[images]
        return start(Decoding(pipe.engines, conditions[images], opts, seeds, mask))

    first = part([0, 1], [7, 8])
    for _ in range(3):
        first.step()
    joined = type(first).combine([(first, torch.arange(2)), (part([2], [20]), torch.arange(1))])
    for _ in range(2):
        joined.step()
    staying = type(joined).combine([(joined, torch.tensor([1, 2]))])  # image 0 leaves (a cancelled request)
    tokens, stats = run(staying)
    pipe.engines.release(staying.d.leases)

    for row, (image, seed) in enumerate([(1, 8), (2, 20)]):
        mask = None if masks is None else masks[image : image + 1]
        alone_tokens, alone_stats = _alone(pipe, opts, conditions[image : image + 1], seed, mask)
        assert torch.equal(tokens[row], alone_tokens), f"image {image}"
        assert stats[row].trace == alone_stats.trace
        assert (stats[row].target_forwards, stats[row].drafter_forwards) == (alone_stats.target_forwards,
                                                                             alone_stats.drafter_forwards)


def test_concurrent_requests_are_merged_and_get_their_own_images(pipeline_factory, monkeypatch):
    pipe = pipeline_factory(max_batch=6)
    merges = []
    combine = Speculation.combine.__func__

    def counting(cls, parts):
        merges.append(len(parts))
        return combine(cls, parts)

    monkeypatch.setattr(Speculation, "combine", classmethod(counting))
    opts = dict(mode="vvs", temperature=1.0, cfg_scale=2.0, skip_interval=2, decode_images=False)
    requests = [([1, 2], 0), ([3], 10), ([4, 5, 6], 20), ([7], 30), ([8, 9], 40), ([0], 50), ([2, 2], 60)]
    alone = [pipe.generate(torch.tensor(c), seed=s, **opts).tokens for c, s in requests]
    merges.clear()
    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        together = list(pool.map(lambda r: pipe.generate(torch.tensor(r[0]), seed=r[1], **opts).tokens, requests))
    for i, (a, b) in enumerate(zip(alone, together)):
        assert torch.equal(a, b), f"request {i}"
    assert 2 in merges, "no request joined a running batch"
    _wait_idle(pipe)


def _wait_running(pipe, timeout=30.0):
    deadline = time.monotonic() + timeout
    while pipe.scheduler.status()["running_images"] == 0:
        assert time.monotonic() < deadline, "the request never started"
        time.sleep(0.005)


def _wait_idle(pipe, timeout=30.0):
    deadline = time.monotonic() + timeout
    while (s := pipe.scheduler.status())["running_images"] or s["waiting_images"]:
        assert time.monotonic() < deadline, f"slots were not freed: {s}"
        time.sleep(0.01)


@pytest.mark.parametrize("mode", ["vvs", "sjd-pac"])
def test_a_cancelled_request_frees_its_slots_and_others_go_on(pipeline_factory, mode):
    pipe = pipeline_factory(max_batch=32)
    opts = dict(mode=mode, temperature=1.0)
    job = pipe.submit(torch.arange(10).repeat(3), seed=0, **opts)
    other = pipe.submit(torch.tensor([5]), seed=3, **opts)
    _wait_running(pipe)
    assert job.cancel()
    with pytest.raises(CancelledError):
        job.result()
    alone = pipe.generate(torch.tensor([5]), seed=3, decode_images=False, **opts)
    assert torch.equal(other.result(60).tokens, alone.tokens)
    _wait_idle(pipe)


def test_a_request_past_its_timeout_fails_and_frees_its_slots(pipeline_factory, monkeypatch):
    """The request is running (its images are in the batch, cycles slowed down) when its time runs out; a request
    beside it gets the tokens it would get alone."""
    pipe = pipeline_factory(max_batch=32)
    step = Speculation.step

    def slow_step(self):
        time.sleep(0.1)
        step(self)

    monkeypatch.setattr(Speculation, "step", slow_step)
    slow = pipe.submit(torch.arange(10).repeat(2), mode="sd", seed=0, timeout=0.3)
    other = pipe.submit(torch.tensor([5]), mode="sd", seed=3)
    _wait_running(pipe)
    with pytest.raises(RequestTimeout, match="timed out"):
        slow.result(60)
    beside = other.result(60).tokens
    monkeypatch.undo()
    assert torch.equal(beside, pipe.generate(torch.tensor([5]), mode="sd", seed=3, decode_images=False).tokens)
    _wait_idle(pipe)


def test_a_full_queue_refuses_with_busy_and_recovers(pipeline_factory):
    pipe = pipeline_factory(max_batch=1)
    pipe.scheduler.max_queue = 2
    first = pipe.submit(torch.tensor([1, 2, 3]), mode="sd", seed=0)  # an empty queue takes it
    with pytest.raises(Busy, match="queue is full"):
        pipe.submit(torch.tensor([4]), seed=0)
    clean = pipeline_factory(max_batch=4)
    assert torch.equal(first.result(120).tokens,
                       clean.generate(torch.tensor([1, 2, 3]), mode="sd", seed=0, decode_images=False).tokens)
    assert torch.equal(pipe.generate(torch.tensor([4]), seed=0, decode_images=False).tokens,
                       clean.generate(torch.tensor([4]), seed=0, decode_images=False).tokens)


def test_a_failing_step_fails_its_requests_and_the_scheduler_goes_on(pipeline_factory, monkeypatch):
    pipe = pipeline_factory()
    failed = threading.Event()
    step = AutoRegression.step

    def failing(self):
        if not failed.is_set():
            failed.set()
            raise RuntimeError("device lost")
        return step(self)

    monkeypatch.setattr(AutoRegression, "step", failing)
    with pytest.raises(RuntimeError, match="device lost"):
        pipe.generate(torch.tensor([1, 2]), mode="ar", seed=0, decode_images=False)
    after = pipe.generate(torch.tensor([1, 2]), mode="ar", seed=0, decode_images=False)
    monkeypatch.undo()
    assert torch.equal(after.tokens, pipeline_factory().generate(torch.tensor([1, 2]), mode="ar", seed=0,
                                                                  decode_images=False).tokens)
    _wait_idle(pipe)


def test_a_failed_join_fails_only_the_newcomers(pipeline_factory, monkeypatch):
    """Merging newcomers into a running batch fails (say, out of memory): the newcomers' futures settle with the
    error at once, the running batch goes on and gets the tokens of a clean run, and the scheduler stays usable."""
    pipe = pipeline_factory()
    opts = dict(mode="vvs", skip_interval=2, temperature=1.0)
    clean = pipe.generate(torch.tensor([1, 2]), seed=0, decode_images=False, **opts).tokens
    stepping, release = threading.Event(), threading.Event()
    step, combine = Speculation.step, Speculation.combine.__func__

    def held(self):
        stepping.set()
        release.wait(30)
        return step(self)

    def failing(cls, parts):
        if len(parts) > 1:
            raise RuntimeError("out of memory while merging")
        return combine(cls, parts)

    monkeypatch.setattr(Speculation, "step", held)
    monkeypatch.setattr(Speculation, "combine", classmethod(failing))
    first = pipe.submit(torch.tensor([1, 2]), seed=0, **opts)
    assert stepping.wait(30), "the first request never started"
    joining = pipe.submit(torch.tensor([3]), seed=5, **opts)
    release.set()
    with pytest.raises(RuntimeError, match="out of memory while merging"):
        joining.result(30)
    assert torch.equal(first.result(60).tokens, clean)
    _wait_idle(pipe)
    monkeypatch.undo()
    assert pipe.generate(torch.tensor([3]), seed=5, decode_images=False, **opts).tokens.shape[0] == 1


def test_a_hung_step_shows_as_stalled_and_an_idle_scheduler_does_not(pipeline_factory, monkeypatch):
    pipe = pipeline_factory()
    release = threading.Event()
    step = AutoRegression.step

    def hanging(self):
        release.wait(30)
        return step(self)

    monkeypatch.setattr(AutoRegression, "step", hanging)
    job = pipe.submit(torch.tensor([1]), mode="ar", seed=0)
    time.sleep(0.5)
    assert pipe.scheduler.stalled_for() >= 0.4
    release.set()
    job.result(60)
    _wait_idle(pipe)
    time.sleep(0.3)
    assert pipe.scheduler.stalled_for() == 0.0
