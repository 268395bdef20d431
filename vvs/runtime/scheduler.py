"""Continuous batching: one thread decodes every running image, and requests join and leave at cycle boundaries.

Requests wait in a bounded queue of images. Before each round the scheduler drops the images of cancelled and
timed-out requests, then admits waiting images while fewer than ``max_batch`` are running: it prefills them as
one batch and combines them into the running batch with the same options (one running batch per set of
options; the rounds step each batch once in turn). Images that are done leave the batch and are delivered when
their request is complete. Each image keeps its own state and random stream, so a request gets the tokens it
would get alone, whatever else is running.

At interpreter exit (a script's end, Ctrl-C in a command) every scheduler is closed and its thread joined: the
thread stops at its next cycle boundary, after the native call it is in. A thread left inside ONNX Runtime or
torch while the interpreter tears down aborts the process.
"""
from __future__ import annotations

import atexit
import threading
import time
import weakref
from collections import deque
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field

import torch

from vvs.engines.base import EngineSet
from vvs.errors import VVSError
from vvs.runtime.decode import Decoding
from vvs.runtime.loops import Loop, start
from vvs.runtime.options import DecodeOptions
from vvs.runtime.stats import ImageStats


class Busy(VVSError):
    """The queue is full; try again later."""


class RequestTimeout(VVSError):
    """A request was not done within its timeout."""


@dataclass(eq=False)
class Request:
    conditions: torch.Tensor  # [n] class ids or [n, C, caption_dim] captions
    caption_mask: torch.Tensor | None
    opts: DecodeOptions
    seeds: list[int]
    deadline: float | None  # time.monotonic() after which the request fails
    future: Future = field(default_factory=Future)
    tokens: list = field(init=False)  # per image, filled as images finish
    stats: list = field(init=False)

    def __post_init__(self):
        self.tokens = [None] * len(self.seeds)
        self.stats = [None] * len(self.seeds)

    @property
    def images(self) -> int:
        return len(self.seeds)

    def deliver(self, image: int, tokens: torch.Tensor, stats: ImageStats) -> None:
        self.tokens[image], self.stats[image] = tokens, stats
        if all(t is not None for t in self.tokens):
            _settle(self.future, Future.set_result, (torch.stack(self.tokens), self.stats))

    def fail(self, error: BaseException) -> None:
        _settle(self.future, Future.set_exception, error)

    def abandoned(self) -> bool:
        """Cancelled by the caller, failed, or past its deadline (then failed here)."""
        if not self.future.done() and self.deadline is not None and time.monotonic() > self.deadline:
            self.fail(RequestTimeout("the request timed out before its images were done"))
        return self.future.done()


def _settle(future: Future, how, value) -> None:
    try:
        how(future, value)
    except InvalidStateError:  # the caller cancelled it meanwhile
        pass


@dataclass
class Running:
    """One running batch and, per image, the request and index it belongs to."""
    loop: Loop
    owners: list[tuple[Request, int]]


class Scheduler:
    def __init__(self, engines: EngineSet, max_batch: int = 16, max_queue: int = 256):
        if max_batch < 1 or max_queue < 1:
            raise VVSError(f"max_batch ({max_batch}) and max_queue ({max_queue}) must be at least 1")
        self.engines, self.max_batch, self.max_queue = engines, max_batch, max_queue
        self.waiting: deque[tuple[Request, int]] = deque()
        self.running: dict[DecodeOptions, Running] = {}
        self.lock = threading.Lock()
        self.closed = False
        self.thread: threading.Thread | None = None
        self.occupancy = (0, 0)  # running images and batches, as of the last round (read by other threads)
        self.last_round = time.monotonic()
        _LIVE.add(self)

    def submit(self, conditions: torch.Tensor, opts: DecodeOptions, seeds: list[int],
               caption_mask: torch.Tensor | None = None, timeout: float | None = None) -> Future:
        """Queue one request; its future gives ``(tokens [n, N], [ImageStats] * n)``. Cancel it with
        ``future.cancel()``. Raises :class:`Busy` when images wait and ``n`` more would exceed ``max_queue`` (a
        larger request still gets an empty queue)."""
        request = Request(conditions, caption_mask, opts, seeds,
                          None if timeout is None else time.monotonic() + timeout)
        with self.lock:
            if self.closed:
                raise VVSError("the scheduler is closed")
            if self.waiting and len(self.waiting) + request.images > self.max_queue:
                raise Busy(f"the queue is full ({len(self.waiting)} of {self.max_queue} images waiting); "
                           "retry later or raise max_queue")
            self.waiting.extend((request, i) for i in range(request.images))
            if self.thread is None:
                self.last_round = time.monotonic()
                self.thread = threading.Thread(target=self._serve, name="vvs-scheduler", daemon=True)
                self.thread.start()
        return request.future

    def status(self) -> dict:
        running_images, running_batches = self.occupancy
        return {"waiting_images": len(self.waiting), "running_images": running_images,
                "running_batches": running_batches, "max_batch": self.max_batch, "max_queue": self.max_queue}

    def stalled_for(self) -> float:
        """Seconds since the last round ended while there is work (0 when idle): a hung device or backend shows
        here, for a service's health check."""
        with self.lock:
            busy = self.thread is not None
        return time.monotonic() - self.last_round if busy else 0.0

    def close(self) -> None:
        """Fail what is queued or running and stop the thread."""
        with self.lock:
            self.closed = True
            thread = self.thread
        if thread is not None:
            thread.join()

    # ------------------------------------------------------------------ the scheduler thread

    def _serve(self) -> None:
        while True:
            with self.lock:
                if not self.closed and not self.waiting and not self.running:
                    self.thread = None  # idle: the next submit starts a thread again
                    return
                if self.closed:
                    break
                self.waiting = deque(w for w in self.waiting if not w[0].abandoned())
            try:
                self._round()
            except Exception as error:  # noqa: BLE001 - a bug or an exhausted device: fail what runs, go on
                self._fail_running(error)
            self.occupancy = (sum(len(r.owners) for r in self.running.values()), len(self.running))
            self.last_round = time.monotonic()
        closed = VVSError("the pipeline was closed")
        with self.lock:
            for request, _ in self.waiting:
                request.fail(closed)
            self.waiting.clear()
        self._fail_running(closed)
        self.occupancy = (0, 0)

    def _round(self) -> None:
        for key in list(self.running):
            self._leave(key, [not r.abandoned() for r, _ in self.running[key].owners])
        self._admit()
        for key in list(self.running):
            self._step(key)

    def _fail_running(self, error: BaseException) -> None:
        for key in list(self.running):
            for request, _ in self.running[key].owners:
                request.fail(error)
            self.engines.release(self.running.pop(key).loop.d.leases)

    def _admit(self) -> None:
        """Prefill waiting images (up to the free room) and combine them into the running batches."""
        room = self.max_batch - sum(len(r.owners) for r in self.running.values())
        with self.lock:
            taken = [self.waiting.popleft() for _ in range(min(room, len(self.waiting)))]
        groups: dict[DecodeOptions, list[tuple[Request, int]]] = {}
        for owner in taken:
            groups.setdefault(owner[0].opts, []).append(owner)
        for opts, owners in groups.items():
            leases: list = []
            try:
                d = Decoding(self.engines, opts=opts, seeds=[r.seeds[i] for r, i in owners], **_batch(owners))
                leases = d.leases
                loop = start(d)
            except Exception as error:  # noqa: BLE001 - the requests get the error, the scheduler goes on
                self.engines.release(leases)
                for request, _ in owners:
                    request.fail(error)
                continue
            running = self.running.get(opts)
            if running is None:
                self.running[opts] = Running(loop, owners)
            else:
                everyone = torch.arange(len(running.owners), device=d.dev)
                try:
                    merged = type(loop).combine([(running.loop, everyone), (loop, d.arange)])
                except Exception as error:  # noqa: BLE001 - the newcomers get it; the running batch is untouched
                    self.engines.release(leases)
                    for request, _ in owners:
                        request.fail(error)
                    continue
                self.running[opts] = Running(merged, running.owners + owners)

    def _step(self, key: DecodeOptions) -> None:
        running = self.running[key]
        try:
            running.loop.step()
        except Exception as error:  # noqa: BLE001
            for request, _ in running.owners:
                request.fail(error)
            self.engines.release(self.running.pop(key).loop.d.leases)
            return
        done = running.loop.plan.done  # the cycle's one read already brought it to the host
        if any(done):
            images = [i for i, finished in enumerate(done) if finished]
            tokens, stats = running.loop.d.finish(images)
            for j, i in enumerate(images):
                request, index = running.owners[i]
                request.deliver(index, tokens[j], stats[j])
            self._leave(key, [not finished for finished in done])

    def _leave(self, key: DecodeOptions, keep: list[bool]) -> None:
        """Keep only the images marked in ``keep`` of one running batch."""
        running = self.running[key]
        if all(keep):
            return
        kept = [i for i, k in enumerate(keep) if k]
        if not kept:
            self.engines.release(running.loop.d.leases)
            del self.running[key]
            return
        loop = type(running.loop).combine([(running.loop, torch.tensor(kept, device=running.loop.d.dev))])
        self.running[key] = Running(loop, [running.owners[i] for i in kept])


def _batch(owners: list[tuple[Request, int]]) -> dict:
    """``Decoding``'s conditions and caption mask for these images."""
    conditions = torch.stack([r.conditions[i] for r, i in owners])
    if owners[0][0].caption_mask is None:
        return {"conditions": conditions}
    return {"conditions": conditions, "caption_mask": torch.stack([r.caption_mask[i] for r, i in owners])}


_LIVE: "weakref.WeakSet[Scheduler]" = weakref.WeakSet()


@atexit.register
def _close_all() -> None:
    for scheduler in list(_LIVE):
        scheduler.close()
