"""Each upstream's own admission (SPEC S10) on a real Redis, single and cluster: limit, live slots and refusal are
kept apart per upstream; the first upstream is today's `{adm}` keys, so a one-URL store is unchanged."""

from __future__ import annotations

from redis.asyncio import Redis

from broker.admission.pacing import Pacing
from broker.events import HoldReason
from broker.store import keys
from broker.store.admission import AdmissionStore
from broker.store.upstream_admission import UpstreamSlots, slots_of
from broker.upstreams import build
from tests.conftest import BOTH_BACKENDS

pytestmark = BOTH_BACKENDS

FIRST, SECOND, THIRD = "hermes-1:8642", "hermes-2:8642", "10.0.0.7:8642/agent"
NOW = 1_000_000


def fleet(redis: Redis) -> AdmissionStore:
    upstreams = build([f"http://{FIRST}", f"http://{SECOND}", f"https://{THIRD}"], None, [0, 6, 0])
    return AdmissionStore(redis, Pacing(slot_ttl_ms=5_000), upstreams=slots_of(upstreams))


async def test_a_refusal_and_live_slots_stay_with_their_upstream(redis: Redis) -> None:
    store = fleet(redis)
    # Given a run accepted on each of the first two upstreams, and the third refusing with a 429
    await store.accepted("job_a", NOW, upstream=FIRST)
    await store.accepted("job_b", NOW, upstream=SECOND)
    await store.accepted("job_c", NOW, upstream=SECOND)
    refusal = await store.refused(
        "job_d",
        NOW,
        reason=HoldReason.BUSY,
        detail="Full.",
        retry_after_ms=1_000,
        jitter=0.0,
        place="1",
        upstream=THIRD,
    )
    assert refusal.began and refusal.limit == 1  # a 429 with none of ours live there: its learnt limit is 1
    # Then each upstream's figures are its own, in HERMES_URL order
    line = await store.state(NOW)
    figures = {u.name: u for u in line.upstreams}
    assert [u.name for u in line.upstreams] == [FIRST, SECOND, THIRD]
    assert (figures[FIRST].live, figures[FIRST].refusing, figures[FIRST].learnt) == (1, None, True)
    assert (figures[SECOND].live, figures[SECOND].limit, figures[SECOND].learnt) == (2, 6, False)
    assert (figures[THIRD].live, figures[THIRD].limit, figures[THIRD].refusing) == (0, 1, HoldReason.BUSY)
    assert figures[THIRD].detail == "Full." and figures[THIRD].refused == 1
    # and the line-wide fields are the first upstream's, as a one-URL broker shows them
    assert (line.live, line.refusing, line.limit) == (1, None, figures[FIRST].limit)
    # When a run on the second settles, only its slot is freed
    await store.release("job_b", freed=True, upstream=SECOND)
    line = await store.state(NOW)
    assert [u.live for u in line.upstreams] == [1, 1, 0]


async def test_the_first_upstream_keeps_todays_keys_and_the_others_are_keyed_by_name(redis: Redis) -> None:
    store = fleet(redis)
    await store.accepted("job_a", NOW, upstream=FIRST)
    await store.accepted("job_b", NOW, upstream=THIRD)
    await store.hold(["job_c"], NOW, upstream=SECOND)
    assert await redis.zrange(keys.ADMISSION_LIVE, 0, -1) == ["job_a"]
    assert await redis.zrange(f"hbr:{{adm:{THIRD}}}:live", 0, -1) == ["job_b"]
    assert await redis.zrange(f"hbr:{{adm:{SECOND}}}:live", 0, -1) == ["job_c"]
    # a job accepted by a broker before SPEC S10 names no upstream: it is the first's
    await store.release("job_a", freed=True, upstream=None)
    assert await redis.zcard(keys.ADMISSION_LIVE) == 0


async def test_a_one_url_store_reads_what_the_broker_before_upstreams_wrote(redis: Redis) -> None:
    # Given the admission state a broker before SPEC S10 left: a learnt limit, a refusal, a live slot
    await redis.hset(keys.ADMISSION_STATE, mapping={"limit": "7", "refusing": "draining", "detail": "Draining."})
    await redis.zadd(keys.ADMISSION_LIVE, {"job_old": NOW + 5_000})
    # When a one-URL broker of this version reads it (the default slots, or built from its config)
    for store in (
        AdmissionStore(redis, Pacing()),
        AdmissionStore(redis, Pacing(), upstreams=slots_of(build(["http://127.0.0.1:8642"], None, [0]))),
    ):
        line = await store.state(NOW)
        # Then it sees the same figures, as its only upstream's and as the line's
        (only,) = line.upstreams
        assert (line.limit, line.live, line.refusing) == (7, 1, HoldReason.DRAINING)
        assert (only.limit, only.live, only.refusing, only.detail) == (7, 1, HoldReason.DRAINING, "Draining.")
        assert isinstance(store.upstreams[0], UpstreamSlots) and store.upstreams[0].keys == keys.FIRST_ADMISSION
