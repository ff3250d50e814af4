"""The event hub: `XREAD BLOCK` readers over every followed job stream, fanned out to per-subscriber
buffers, so the Redis connections used for SSE never grow with the clients (STYLE A.8 #1). On a single
Redis one reader (a "lane") follows every stream; on a cluster an XREAD must name keys of one slot, so
there is one lane per partition that has subscribers (at most PARTITIONS), each on the node of its slot.

Handoff contract (no gaps, no duplicates): a subscriber registers with `subscribe(job, last)` and THEN
reads the stream after `last` itself (XRANGE). Every read the hub dispatches after the registration reaches
the subscriber; every read dispatched before it was executed by Redis before the subscriber's XRANGE, so
the XRANGE covers it. The subscriber drops frames whose id is not above the last id it sent. The same
rule applies after an overflow (`Overflowed`): `resume()` re-registers, then the subscriber reads again.
"""

from __future__ import annotations

import asyncio
import enum
import random
from collections import deque
from collections.abc import Iterable
from typing import NamedTuple

import orjson
from aiohttp import web
from redis.asyncio import Redis

from broker.events import JobEvent
from broker.logging import get_logger
from broker.store import keys
from broker.store.connection import is_cluster
from broker.store.live import LiveReader, UnblockRefused
from broker.store.outage import REDIS_FAILURES, is_outage, outage_name
from broker.tasks import cancel_all
from projections.feed import shown

READ_COUNT = 500  #: entries per stream per XREAD
QUEUE_LIMIT = 2000  #: frames buffered per subscriber before it falls back to XRANGE
BLOCK_MS = 5000  #: XREAD BLOCK while CLIENT UNBLOCK works (a new stream wakes the reader at once)
FALLBACK_BLOCK_MS = 500  #: XREAD BLOCK when CLIENT UNBLOCK is not permitted (the set changes at this pace)
BACKOFF_S = (0.05, 5.0)  #: reconnect backoff, min and max


def id_key(stream_id: str) -> tuple[int, int]:
    """A Redis stream id as a comparable `(ms, seq)`."""
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


class Frame(NamedTuple):
    """One SSE frame ready to write: its stream id, its bytes, and whether it ends the job's feed."""

    id: str
    key: tuple[int, int]
    data: bytes
    terminal: bool


def frames(job_id: str, entries: Iterable[tuple[str, JobEvent]]) -> list[Frame]:
    """The frames of the entries the feed shows (rendered once, shared by every subscriber)."""
    return [
        Frame(entry_id, id_key(entry_id), b"id: %s\ndata: %s\n\n" % (entry_id.encode(), orjson.dumps(doc)), end)
        for entry_id, doc, end in shown(job_id, entries)
    ]


class Signal(enum.Enum):
    IDLE = "idle"  #: nothing arrived within the wait
    OVERFLOWED = "overflowed"  #: frames were dropped: `resume()`, then read the stream after your last id
    CLOSED = "closed"  #: the replica shuts down: end the stream without a terminal frame


class Subscription:
    """One SSE client's view of the hub: a bounded buffer filled by the reader."""

    __slots__ = ("_items", "_limit", "_wake", "closed", "job_id", "overflowed")

    def __init__(self, job_id: str, limit: int) -> None:
        self.job_id = job_id
        self._items: deque[Frame] = deque()
        self._limit = limit
        self._wake = asyncio.Event()
        self.overflowed = False
        self.closed = False

    async def next(self, timeout_s: float) -> Frame | Signal:
        """The next frame, or a signal; waits at most `timeout_s`."""
        while not self.closed and not self._items:
            if self.overflowed:
                return Signal.OVERFLOWED
            self._wake.clear()
            try:
                async with asyncio.timeout(timeout_s):
                    await self._wake.wait()
            except TimeoutError:
                return Signal.IDLE
        return Signal.CLOSED if self.closed else self._items.popleft()

    def ready(self) -> list[Frame]:
        """Every frame already buffered (to write them in one go)."""
        items = list(self._items)
        self._items.clear()
        return items

    def resume(self) -> None:
        self.overflowed = False

    def push(self, batch: list[Frame]) -> bool:
        """Buffer `batch`; True when it overflowed the buffer (the subscriber then re-reads from its last id)."""
        if self.closed or self.overflowed or not batch:
            return False
        overflowed = len(self._items) + len(batch) > self._limit
        if overflowed:
            self.overflowed = True  # nothing is lost: the subscriber reads the stream after its last id
            self._items.clear()
        else:
            self._items.extend(batch)
        self._wake.set()
        return overflowed

    def close(self) -> None:
        self.closed = True
        self._wake.set()


class _Follow:
    __slots__ = ("cursor", "subscribers")

    def __init__(self, cursor: str) -> None:
        self.cursor = cursor  #: the id the reader has read this stream up to
        self.subscribers: set[Subscription] = set()


class Hub:
    """The replica's live readers. `start()`/`stop()` with the app; `subscribe()`/`unsubscribe()` per client."""

    def __init__(self, redis: Redis, *, queue_limit: int = QUEUE_LIMIT, block_ms: int = BLOCK_MS) -> None:
        self._redis = redis
        self._per_partition = is_cluster(redis)
        self.queue_limit = queue_limit  #: frames buffered per new subscriber
        self._block_ms = block_ms
        self._lanes: dict[int, _Lane] = {}
        self._started = False
        self.stopping = asyncio.Event()  #: set on shutdown: every stream ends

    @property
    def client_id(self) -> int | None:
        """CLIENT ID of the first lane's reader connection (tests kill it)."""
        return next((lane.reader.client_id for lane in self._lanes.values()), None)

    @property
    def subscribers(self) -> int:
        return sum(lane.subscribers for lane in self._lanes.values())

    @property
    def overflows(self) -> int:
        """Subscribers that fell back to XRANGE (slow clients)."""
        return sum(lane.overflows for lane in self._lanes.values())

    def subscribe(self, job_id: str, after: str) -> Subscription:
        """Register a subscriber that has sent everything up to `after` (see the module's handoff contract)."""
        subscription = Subscription(job_id, self.queue_limit)
        if self.stopping.is_set():
            subscription.close()
            return subscription
        self._lane(job_id).follow(subscription, after)
        return subscription

    def unsubscribe(self, subscription: Subscription) -> None:
        lane = self._lanes.get(self._lane_of(subscription.job_id))
        if lane is not None:
            lane.unfollow(subscription)

    def close_subscribers(self) -> None:
        """Shutdown: end every open stream (clients resume elsewhere with their last id)."""
        self.stopping.set()
        for lane in self._lanes.values():
            lane.close_subscribers()

    async def start(self) -> None:
        self._started = True
        for lane in self._lanes.values():
            lane.start()

    async def stop(self) -> None:
        self._started = False
        await asyncio.gather(*(lane.stop() for lane in self._lanes.values()))

    def _lane_of(self, job_id: str) -> int:
        return keys.partition_of(job_id) if self._per_partition else 0

    def _lane(self, job_id: str) -> _Lane:
        number = self._lane_of(job_id)
        lane = self._lanes.get(number)
        if lane is None:
            reader = LiveReader(self._redis, route=keys.events(job_id) if self._per_partition else None)
            lane = self._lanes[number] = _Lane(reader, self._block_ms)
            if self._started:
                lane.start()
        return lane


class _Lane:
    """One live reader over the followed streams of one slot (a cluster) or of every job (a single Redis)."""

    def __init__(self, reader: LiveReader, block_ms: int) -> None:
        self.reader = reader
        self.overflows = 0
        self._block_ms = block_ms
        self._follows: dict[str, _Follow] = {}
        self._changed = asyncio.Event()
        self._version = 0  #: bumped when a stream joins the followed set
        self._reading: int | None = None  #: the version the in-flight XREAD was issued for
        self._unblocker: asyncio.Task[None] | None = None
        self._can_unblock = True
        self._task: asyncio.Task[None] | None = None
        self._log = get_logger(Hub)

    @property
    def subscribers(self) -> int:
        return sum(len(follow.subscribers) for follow in self._follows.values())

    def follow(self, subscription: Subscription, after: str) -> None:
        follow = self._follows.get(subscription.job_id)
        if follow is None:
            follow = self._follows[subscription.job_id] = _Follow(after)
            self._version += 1
            self._changed.set()
            self._wake_reader()
        follow.subscribers.add(subscription)

    def unfollow(self, subscription: Subscription) -> None:
        follow = self._follows.get(subscription.job_id)
        if follow is not None:
            follow.subscribers.discard(subscription)
            if not follow.subscribers:
                del self._follows[subscription.job_id]  # the next XREAD leaves it out

    def close_subscribers(self) -> None:
        for follow in self._follows.values():
            for subscription in follow.subscribers:
                subscription.close()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="event-hub")

    async def stop(self) -> None:
        self._follows.clear()
        for task in (self._unblocker, self._task):
            if task is None:
                continue
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=0.2)
            if not done:
                await self.reader.drop()  # a blocked read can outlive its cancellation: close its socket
            await cancel_all([task])
        self._task = None
        await self.reader.close()

    async def _run(self) -> None:
        backoff = BACKOFF_S[0]
        while True:
            _reraise_cancellation()  # redis-py can swallow a cancellation inside a read that then returns
            if not self._follows:
                self._changed.clear()
                await self._changed.wait()
                continue
            try:
                await self._read_once()
                backoff = BACKOFF_S[0]
            except Exception as error:
                _reraise_cancellation()  # redis-py may turn a cancelled read into a ConnectionError
                await self.reader.drop()
                if is_outage(error):
                    self._log.warning("Lost the event hub's Redis connection.", extra={"error": outage_name(error)})
                    await asyncio.sleep(backoff * (1 + random.random()))
                    backoff = min(backoff * 2, BACKOFF_S[1])
                else:  # the loop guard: a bug must not end live delivery for every client of the replica
                    self._log.exception("Failed to read job events.")
                    await asyncio.sleep(BACKOFF_S[1])

    async def _read_once(self) -> None:
        follows = list(self._follows.items())
        self._changed.clear()
        block_ms = self._block_ms if self._can_unblock else min(self._block_ms, FALLBACK_BLOCK_MS)
        self._reading = self._version
        try:
            read = await self.reader.read(
                [(job_id, follow.cursor) for job_id, follow in follows], count=READ_COUNT, block_ms=block_ms
            )
        finally:
            self._reading = None
        by_key = dict(follows)
        for job_id, entries in read:
            follow = self._follows.get(job_id)
            if follow is None or follow is not by_key.get(job_id) or not entries:
                continue  # unfollowed (or re-followed from another cursor) meanwhile: the next read is exact
            follow.cursor = entries[-1][0]
            batch = frames(job_id, entries)
            for subscription in follow.subscribers:
                self.overflows += subscription.push(batch)

    def _wake_reader(self) -> None:
        if self._can_unblock and self._reading is not None and (self._unblocker is None or self._unblocker.done()):
            self._unblocker = asyncio.create_task(self._unblock(), name="event-hub-unblock")

    async def _unblock(self) -> None:
        """Interrupt a blocked XREAD whose stream set is stale."""
        for _ in range(50):
            reading = self._reading
            if reading is None or reading >= self._version:
                return  # the next XREAD already includes the new streams
            try:
                if await self.reader.unblock():
                    return
            except UnblockRefused as error:  # fall back to short blocks
                self._can_unblock = False
                self._log.warning("Cannot unblock the event hub's reader.", extra={"error": str(error)})
                return
            except REDIS_FAILURES:
                return  # the reader reconnects and rereads the set anyway
            await asyncio.sleep(0.005)  # sent before the XREAD reached Redis: try again


def _reraise_cancellation() -> None:
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


hub_key = web.AppKey("hub", Hub)
