"""The upstreams' shared health on a real Redis (SPEC S10), single and cluster: a lone
upstream and a rolling upgrade from the previous main (3644072)."""

from __future__ import annotations

from redis.asyncio import Redis

from broker.admission.pacing import Pacing
from broker.store.admission import AdmissionStore
from broker.store.upstream_admission import slots_of
from broker.upstreams import build
from broker.upstreams.health import Health, Heard, answered, failed, report_due
from tests.conftest import BOTH_BACKENDS

pytestmark = BOTH_BACKENDS

FIRST, SECOND = "hermes-1:8642", "hermes-2:8642"
NOW = 1_000_000


def store_of(redis: Redis, *names: str) -> AdmissionStore:
    upstreams = build([f"http://{name}" for name in names], None, [0] * len(names))
    return AdmissionStore(redis, Pacing(slot_ttl_ms=5_000), upstreams=slots_of(upstreams))


async def test_a_lone_upstream_is_never_lost_by_a_streak_left_from_a_fleet(redis: Redis) -> None:
    # Given a fleet whose first upstream's calls were failing (the prober wrote its streak into `{adm}`)
    fleet = store_of(redis, FIRST, SECOND)
    await fleet.health.report(FIRST, failed(answered(Heard(), NOW - 10_000), NOW))
    # When the operator drops that upstream from HERMES_URL: the remaining one is now the first, on `{adm}` (SPEC
    # S10: one URL behaves exactly as before, on the same stored keys)
    lone = store_of(redis, SECOND)
    lost_ms = lone.pacing.upstream_lost_ms
    # Then it is never lost: a failed poll of a live run never resubmits it (a second run on the same Hermes)
    assert not await lone.lost(SECOND, NOW + lost_ms)
    state = await lone.state(NOW + lost_ms, lines=False)
    assert not state.upstreams[0].lost
    # And it reads unreachable only until the prober's first probe is answered (it asks an upstream nobody heard
    # from lately at once)
    await lone.health.report(SECOND, answered(Heard(), NOW + lost_ms))
    state = await lone.state(NOW + lost_ms, lines=False)
    assert state.upstreams[0].condition.value == "up" and not state.upstreams[0].unreachable_since_ms


async def test_an_answer_an_old_replica_stored_ends_the_streak(redis: Redis) -> None:
    # Given a new replica whose calls to the second upstream fail from NOW on (partitioned from it)
    new = store_of(redis, FIRST, SECOND)
    await new.health.report(SECOND, failed(answered(Heard(), NOW - 10_000), NOW))
    # When a replica of the previous main (3644072), which reaches it, records its answers as it always did
    # (`heard_from`: a plain HSET of `answered`, every renew tick)
    state_key = new.upstream(SECOND).keys.state
    lost_ms = new.pacing.upstream_lost_ms
    for at in range(NOW + 1_000, NOW + lost_ms + 1, 1_000):
        await redis.hset(state_key, "answered", at)
    # Then the upstream is not lost: a replica got an answer within the window (SPEC S10: an answer of any replica)
    assert not await new.lost(SECOND, NOW + lost_ms)


def old_is_lost(answered: str | None, failed: str | None, now_ms: int, lost_ms: int) -> bool:
    """The lost rule of the previous main (3644072, broker/store/upstream_admission.py `is_lost`), verbatim."""
    last_answer, last_failure = int(answered or 0), int(failed or 0)
    return last_answer > 0 and last_failure > last_answer and now_ms - last_answer >= lost_ms


async def test_a_new_replicas_one_failed_call_after_a_healthy_hour_is_not_lost_for_an_old_replica(
    redis: Redis,
) -> None:
    # Given two new replicas: one calls the upstream every second for an hour and reports as the prober does (a
    # healthy fleet refreshes the stored answer every half lost window), the other never calls it
    new = store_of(redis, FIRST, SECOND)
    lost_ms = new.pacing.upstream_lost_ms
    busy, reported, shared = Heard(), Heard(), Health()
    hour = 3_600_000
    for at in range(NOW, NOW + hour, 1_000):
        busy = answered(busy, at)
        if report_due(busy, reported, shared, lost_ms // 2):
            shared, reported = await new.health.report(SECOND, busy), busy
    # When the idle one's first call in an hour fails (a blip): its streak is reported, with `failed`
    await new.health.report(SECOND, failed(answered(Heard(), NOW), NOW + hour))
    # Then a replica of the previous main, reading `answered` and `failed` by its own rule during the rollout, does
    # not take the upstream for lost (it would resubmit its live runs there at their next failed poll)
    state = await redis.hmget(new.upstream(SECOND).keys.state, ["answered", "failed"])
    answered_at, failed_at = (None if v is None else str(v if isinstance(v, str) else v.decode()) for v in state)
    assert not old_is_lost(answered_at, failed_at, NOW + hour + 1, lost_ms)
