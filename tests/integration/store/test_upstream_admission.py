"""Each upstream's own admission (SPEC S10) on a real Redis, single and cluster: limit, live slots and refusal are
kept apart per upstream; the first upstream is today's `{adm}` keys, so a one-URL store is unchanged."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from redis.asyncio import Redis

from broker.admission.pacing import Pacing
from broker.events import HoldReason
from broker.store import keys
from broker.store.admission import AdmissionStore
from broker.store.upstream_admission import UpstreamSlots, slots_of
from broker.upstreams import build
from broker.upstreams.health import Health, Heard, merge
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


@given(reports=st.lists(st.builds(Heard, st.integers(0, 50), st.integers(0, 50), st.integers(0, 50)), max_size=6))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
async def test_the_shared_health_is_merged_in_redis_as_the_pure_model_merges_it(
    redis: Redis, reports: list[Heard]
) -> None:
    # SPEC S10: upstream_heard.lua keeps the rule of broker/upstreams/health.py `merge`, report by report
    store = fleet(redis)
    await redis.delete(store.upstream(SECOND).keys.state)
    expected = Health()
    for heard in reports:
        expected = merge(expected, heard)
        assert await store.health.report(SECOND, heard) == expected
    assert await store.health.read(SECOND) == expected


async def test_one_probe_at_a_time_and_a_lost_upstream_is_seen_by_every_replica(redis: Redis) -> None:
    one, other = fleet(redis), fleet(redis)  # two replicas
    assert await one.health.claim_probe(SECOND, NOW, NOW + 2_000)
    assert not await other.health.claim_probe(SECOND, NOW + 1_999, NOW + 4_000)  # paced: not before NOW + 2 s
    assert await other.health.claim_probe(SECOND, NOW + 2_000, NOW + 4_000)
    await one.health.report(SECOND, Heard(answered_ms=NOW - 60_000, failing_since_ms=NOW, failed_ms=NOW))
    lost_ms = one.pacing.upstream_lost_ms
    assert not await other.lost(SECOND, NOW + lost_ms - 1)
    assert await other.lost(SECOND, NOW + lost_ms)
    assert not await other.lost(FIRST, NOW + lost_ms)  # kept apart per upstream
    state = await other.state(NOW + lost_ms, lines=False)
    second = next(u for u in state.upstreams if u.name == SECOND)
    assert second.lost and second.unreachable_since_ms == NOW
