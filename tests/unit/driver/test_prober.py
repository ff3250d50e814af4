"""The prober (broker/driver/prober.py, SPEC S10): a frozen host, orphans left behind.

What is tested here is the loop's timing and order: the shared store is an in-memory stand-in that keeps
upstream_heard.lua's rule (`merge`) and upstream_probe.lua's claim, and the clients are stand-ins whose calls hang
(a frozen host: SIGSTOP keeps its sockets open), fail or answer. The scripts themselves are held to that rule on a
real Redis (tests/integration/store/test_upstream_admission.py), and the prober with real simulators in
tests/e2e/test_upstream_faults.py and tests/integration/driver/test_orphans.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from types import SimpleNamespace
from typing import Any

from broker.driver.prober import Prober
from broker.hermes.models import NotFound, Stopping, Unavailable
from broker.upstreams.health import Health, Heard, answered, failed, merge, reach

LOST_MS = 8_000


class Store:
    """HealthStore in memory: the same merge, one probe at a time, orphans per upstream."""

    def __init__(self) -> None:
        self.health: dict[str, Health] = {}
        self.probe_at: dict[str, int] = {}
        self.orphaned: dict[str, list[str]] = {}

    async def report(self, upstream: str, heard: Heard) -> Health:
        self.health[upstream] = merge(self.health.get(upstream, Health()), heard)
        return self.health[upstream]

    async def read(self, upstream: str) -> Health:
        return self.health.get(upstream, Health())

    async def claim_probe(self, upstream: str, now_ms: int, until_ms: int) -> bool:
        if self.probe_at.get(upstream, 0) > now_ms:
            return False
        self.probe_at[upstream] = until_ms
        return True

    async def orphan(self, upstream: str, run_id: str, now_ms: int) -> None:
        self.orphaned.setdefault(upstream, []).append(run_id)

    async def orphans(self, upstream: str) -> list[str]:
        return list(self.orphaned.get(upstream, [])[:100])

    async def settled(self, upstream: str, run_id: str) -> None:
        self.orphaned[upstream].remove(run_id)


class Client:
    """A Hermes client stand-in: `heard` as the real client keeps it; GET and stop as the test wants them."""

    def __init__(self) -> None:
        self.heard = Heard()
        self.hang = False  #: a frozen host: the call never returns (the real one times out after HERMES_TIMEOUT)
        self.up = True
        self.stops: list[str] = []
        self.stop_fails = 0  #: how many stops still fail (the upstream is back, but flaky)

    async def get(self, run_id: str) -> object:
        if self.hang:
            await asyncio.Event().wait()
        return self._answer(NotFound(run_id))

    async def stop(self, run_id: str) -> object:
        self.stops.append(run_id)
        if self.stop_fails > 0:
            self.stop_fails -= 1
            self.heard = answered(self.heard, _now[0])  # Hermes itself answered: HTTP 500 with its envelope
            return Unavailable("Hermes answered HTTP 500.")
        return self._answer(Stopping(run_id, "stopping"))

    def _answer(self, outcome: object) -> object:
        now = _now[0]
        if self.up:
            self.heard = answered(self.heard, now)
            return outcome
        self.heard = failed(self.heard, now)
        return Unavailable("refused")


_now = [0]


def fleet(*names: str) -> tuple[list[tuple[SimpleNamespace, Client]], dict[str, Client]]:
    clients = {name: Client() for name in names}
    return [(SimpleNamespace(name=name), client) for name, client in clients.items()], clients


async def tick(prober: Prober, now: int) -> None:
    _now[0] = now
    await prober.tick(now)


async def test_a_frozen_upstreams_probe_does_not_stall_the_others_health() -> None:
    # Given a fleet of two: A is frozen (its calls hang until HERMES_TIMEOUT), B has just started to fail
    members, clients = fleet("a", "b")
    store = Store()
    prober = Prober(members, store, lost_ms=LOST_MS)  # type: ignore[arg-type]
    store.health["a"] = Health(answered_ms=500, failing_since_ms=1_000, failed_ms=1_000)
    clients["a"].hang = True
    clients["b"].up = False
    clients["b"].heard = failed(answered(Heard(), 500), 1_500)
    # When the prober looks (its probe of A waits for HERMES_TIMEOUT: 30 s by default, in a fleet at most the lost
    # window)
    looking = asyncio.ensure_future(tick(prober, 2_000))
    await asyncio.sleep(0.2)
    looking.cancel()
    # Then B's failure is in the shared state anyway: its jobs are not routed to it meanwhile (SPEC S10: jobs
    # waiting for it move as soon as it is down), and B's own probe and orphans do not wait for A
    assert store.health.get("b", Health()).failing


async def test_an_orphan_whose_stop_failed_is_stopped_at_a_later_look() -> None:
    # Given an upstream that was lost while holding a run whose job moved on (an orphan)
    members, clients = fleet("a", "b")
    store = Store()
    prober = Prober(members, store, lost_ms=LOST_MS)  # type: ignore[arg-type]
    a = clients["a"]
    a.up = False
    a.heard = failed(answered(Heard(), 100), 1_000)
    await tick(prober, 1_000)
    await tick(prober, 1_000 + LOST_MS)  # lost
    await store.orphan("a", "run_left", 1_000 + LOST_MS)
    # When it answers again, but its first stop of the orphan fails (Hermes answers 500 with its envelope; a
    # 401/403 while keys rotate, or a reset, are alike)
    a.up = True
    a.stop_fails = 1
    for n in range(1, 6):
        await tick(prober, 1_000 + LOST_MS + n * 2_000)
    # Then a later look stops it (SPEC S10: no orphan keeps running)
    assert a.stops.count("run_left") >= 2 and not store.orphaned["a"]


async def test_an_orphan_recorded_after_its_upstream_came_back_is_stopped() -> None:
    # Given an upstream seen lost, then back, by this replica's prober
    members, clients = fleet("a", "b")
    store = Store()
    prober = Prober(members, store, lost_ms=LOST_MS)  # type: ignore[arg-type]
    a = clients["a"]
    a.up = False
    a.heard = failed(answered(Heard(), 100), 1_000)
    await tick(prober, 1_000)
    await tick(prober, 1_000 + LOST_MS)
    a.up = True
    await tick(prober, 3_000 + LOST_MS)  # back: its orphans (none yet) are stopped
    # When a runner whose poll timed out during the lost spell records its orphan now (it read `lost` before the
    # upstream came back; or a replica restarted and records it late; or there were more than 100 of them)
    await store.orphan("a", "run_late", 3_100 + LOST_MS)
    for n in range(1, 6):
        await tick(prober, 3_000 + LOST_MS + n * 2_000)
    # Then it is stopped all the same
    assert "run_late" in a.stops


async def test_an_upstream_whose_streams_answer_every_second_is_never_lost() -> None:
    # Given an upstream whose running streams deliver an event every second, while every new connection to it
    # (creates, polls, this prober's probes) is refused: an overloaded Hermes whose accept queue is full, or a load
    # balancer draining new connections; it answers, so it is not lost (SPEC S10: "every call and stream to it failed
    # for that whole time")
    from broker.upstreams.health import Reach

    members, clients = fleet("a", "b")
    store = Store()
    prober = Prober(members, store, lost_ms=LOST_MS)  # type: ignore[arg-type]
    a = clients["a"]
    a.up = False  # new connections fail
    a.heard = failed(answered(Heard(), 500), 1_000)
    await tick(prober, 1_000)
    seen = []
    for now in range(2_000, 2_000 + 2 * LOST_MS, 1_000):
        # between two ticks: a stream event (an answer), then a refused create
        a.heard = failed(answered(a.heard, now - 900), now - 800)
        await tick(prober, now)
        seen.append(reach(store.health["a"], now, LOST_MS))
    # Then it is never taken for lost (its runs would be resubmitted while they stream: two runs of one job)
    assert Reach.LOST not in seen


async def test_every_orphan_is_stopped_when_more_than_a_look_holds_returns() -> None:
    # Given an upstream lost while it held 150 runs whose jobs moved on (ORPHANS_PER_LOOK is 100: "the rest at its
    # next look")
    members, clients = fleet("a", "b")
    store = Store()
    prober = Prober(members, store, lost_ms=LOST_MS)  # type: ignore[arg-type]
    a = clients["a"]
    a.up = False
    a.heard = failed(answered(Heard(), 100), 1_000)
    await tick(prober, 1_000)
    await tick(prober, 1_000 + LOST_MS)
    for n in range(150):
        await store.orphan("a", f"run_{n}", 1_000 + LOST_MS)
    # When it answers again and the prober keeps looking
    a.up = True
    for n in range(1, 6):
        await tick(prober, 1_000 + LOST_MS + n * 2_000)
    # Then all of them are stopped, not only the first look's 100
    assert len(set(a.stops)) == 150 and not store.orphaned["a"]


class Clock:
    def now_ms(self) -> int:
        _now[0] += 1_000
        return _now[0]


async def test_an_upstream_that_comes_back_is_seen_while_another_is_frozen() -> None:
    # Given a fleet of two: A is frozen (its probe waits for HERMES_TIMEOUT, 30 s by default), B's calls fail
    members, clients = fleet("a", "b")
    store = Store()
    prober = Prober(members, store, lost_ms=LOST_MS)  # type: ignore[arg-type]
    store.health["a"] = Health(answered_ms=500, failing_since_ms=1_000, failed_ms=1_000)
    clients["a"].hang = True
    b = clients["b"]
    b.up = False
    b.heard = failed(answered(Heard(), 500), 1_500)
    _now[0] = 2_000
    looking = asyncio.ensure_future(prober.run(Clock()))  # type: ignore[arg-type]
    try:
        await asyncio.sleep(0.3)
        assert store.health.get("b", Health()).failing
        # When B answers again (a call of a runner got an answer)
        b.up = True
        b.heard = answered(b.heard, _now[0] + 500)
        # Then the prober sees it back within a couple of its 1 s ticks (its jobs and orphans do not wait for A)
        deadline = asyncio.get_running_loop().time() + 3.0
        while store.health.get("b", Health()).failing and asyncio.get_running_loop().time() < deadline:
            await asyncio.sleep(0.1)
        assert not store.health.get("b", Health()).failing
    finally:
        looking.cancel()


async def test_an_idle_upstream_is_asked_by_one_replica_at_a_time_and_found_down_without_a_job() -> None:
    # Given two replicas, each watching two upstreams that answered at 1 s and then had nothing to do
    store = Store()
    replicas = []
    for _ in range(2):
        members, clients = fleet("a", "b")
        for client in clients.values():
            client.heard = answered(Heard(), 1_000)
        replicas.append((Prober(members, store, lost_ms=LOST_MS), clients))  # type: ignore[arg-type]
    probes: list[tuple[int, str]] = []
    for _, clients in replicas:
        for name, client in clients.items():
            asked = client.get

            async def counted(run_id: str, name: str = name, asked: Any = asked) -> object:
                probes.append((_now[0], name))
                return await asked(run_id)

            client.get = counted  # type: ignore[method-assign]
    # When both look every second for 10 s: nobody is asked while it answered lately, then one probe at a time
    for now in range(1_000, 11_000, 1_000):
        for prober, _ in replicas:
            await tick(prober, now)
    assert probes and min(at for at, _ in probes) >= 1_000 + LOST_MS // 2
    for name in ("a", "b"):
        times = [at for at, upstream in probes if upstream == name]
        assert all(later - earlier >= 2_000 for earlier, later in itertools.pairwise(times)), times
    assert not any(store.health.get(name, Health()).failing for name in ("a", "b"))
    # And when B dies while idle, the next probe finds it unreachable (not lost: one failed probe starts the count)
    for _, clients in replicas:
        clients["b"].up = False
    for now in range(11_000, 14_000, 1_000):
        for prober, _ in replicas:
            await tick(prober, now)
    assert reach(store.health["b"], 14_000, LOST_MS).value == "unreachable"
    assert not store.health["a"].failing


class LostOnce(Store):
    """Redis lost under the first report of upstream A (a failover)."""

    def __init__(self) -> None:
        super().__init__()
        self.looks: list[str] = []

    async def report(self, upstream: str, heard: Heard) -> Health:
        self.looks.append(upstream)
        if self.looks.count("a") == 1 and upstream == "a":
            raise ConnectionError("Connection closed by server.")
        return await super().report(upstream, heard)


async def test_a_look_that_fails_leaves_every_upstream_watched_and_a_cancel_stops_every_watch() -> None:
    # Given a fleet of two, and Redis lost under the first look at A
    members, _ = fleet("a", "b")
    store = LostOnce()
    prober = Prober(members, store, lost_ms=LOST_MS)  # type: ignore[arg-type]
    before = asyncio.all_tasks()
    # When the prober runs
    running = asyncio.create_task(prober.run(SimpleNamespace(now_ms=lambda: _now[0])))  # type: ignore[arg-type]
    for _ in range(100):
        if "a" in store.looks and "b" in store.looks:
            break
        await asyncio.sleep(0.01)
    await asyncio.sleep(0.05)
    # Then it goes on watching both (the failed look is logged), and its cancel (a drain) stops every watch: none is
    # left running on its own past the stop, where the event loop's last cancel can be dropped and the process hangs
    assert not running.done()
    running.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await running
    assert asyncio.all_tasks() == before
