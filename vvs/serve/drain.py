"""Stopping a service without dropping a request.

Ray Serve, told to delete an application, lets each replica finish the requests it holds, but its proxy answers
every new request with 404 at once — a load balancer takes that as final. So vvs-serve drains first: it raises a
flag in a small named actor (:class:`DrainState`); every replica polls it, answers new requests with 503 (retry
elsewhere) from then on and reports how many requests it still holds; vvs-serve deletes the application once none
is held, or when the grace period ends.
"""
from __future__ import annotations

import asyncio
import time

import ray

NAME, NAMESPACE = "vvs-drain", "vvs"
POLL_S = 0.2  # how soon after the signal a replica starts refusing
# A replica silent this long is gone (killed, restarted under a new id, scaled down): its requests died with it.
# Waiting for it held every stop for the whole grace period. Polls come every POLL_S from the replica's event loop,
# which the decoding threads never block for long.
GONE_S = 5.0


class Drain:
    """The drain flag and what the replicas report; ``clock`` is injectable for tests."""

    def __init__(self, clock=time.monotonic):
        self.clock = clock
        self.stopping = False
        self.held: dict[str, int] = {}  # requests each replica reported holding
        self.last_report: dict[str, float] = {}
        self.reported_since_stop: set[str] = set()

    def report(self, replica: str, held: int) -> bool:
        """A replica's poll: how many requests it holds; answers whether the service is stopping."""
        self.held[replica] = held
        self.last_report[replica] = self.clock()
        if self.stopping:
            self.reported_since_stop.add(replica)
        return self.stopping

    def stop(self) -> None:
        self.stopping = True
        self.reported_since_stop.clear()

    def drained(self) -> bool:
        """Every live replica has seen the flag (so takes nothing new) and holds no request."""
        now = self.clock()
        live = {r for r, seen in self.last_report.items() if now - seen < GONE_S}
        return live <= self.reported_since_stop and not any(self.held[r] for r in live)


DrainState = ray.remote(num_cpus=0)(Drain)


def create() -> ray.actor.ActorHandle:
    """vvs-serve's drain flag; it lives as long as the vvs-serve process."""
    return DrainState.options(name=NAME, namespace=NAMESPACE).remote()


def drain(state: ray.actor.ActorHandle, grace_s: float) -> None:
    """Raise the flag and wait until the replicas hold no request or ``grace_s`` passes."""
    ray.get(state.stop.remote())
    deadline = time.monotonic() + grace_s
    while not ray.get(state.drained.remote()) and time.monotonic() < deadline:
        time.sleep(POLL_S)


class ReplicaDrain:
    """A replica's side: counts the requests it holds and follows the flag. A replica deployed without vvs-serve
    (from Python, in tests) finds no flag and never stops on its own."""

    def __init__(self):
        self.stopping = False
        self.held = 0
        self._poller: asyncio.Task | None = None

    def watch(self) -> None:
        if self._poller is None:
            self._poller = asyncio.get_running_loop().create_task(self._poll())

    async def _poll(self) -> None:
        try:
            state = ray.get_actor(NAME, namespace=NAMESPACE)
        except ValueError:
            return
        replica = ray.get_runtime_context().get_actor_id()
        while True:
            try:
                self.stopping = await state.report.remote(replica, self.held)
            except ray.exceptions.RayActorError:  # vvs-serve is gone; Ray stops this replica next
                return
            await asyncio.sleep(POLL_S)
