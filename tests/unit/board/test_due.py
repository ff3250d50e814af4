"""When a board key's versions go out (SPEC S5.2, S5.3, S5.6): the pure delivery rules."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.board.due import Deliver, DeliverySettings, Later, Replay, next_step
from broker.store.board import BoardEntry

NOW = 1_796_005_747_391
REFRESH = 60_000


def entry(**fields: object) -> BoardEntry:
    values: dict[str, object] = {"job_id": "job_1", "latest": b"{}", "latest_at": NOW - 10, "expire_at": NOW + 1}
    values.update(fields)
    return BoardEntry(**values)  # type: ignore[arg-type]


def test_a_state_change_goes_out_at_once_even_right_after_a_delivery() -> None:
    pending = entry(pending_at=NOW - 10, pending_change=True, delivered_ms=NOW - 1)
    assert next_step(pending, NOW, REFRESH) == Deliver(NOW - 10)


def test_a_key_never_delivered_goes_out_at_once() -> None:
    assert next_step(entry(pending_at=NOW - 10), NOW, REFRESH) == Deliver(NOW - 10)


def test_activity_waits_for_the_refresh_after_the_previous_delivery() -> None:
    pending = entry(pending_at=NOW - 10, delivered_ms=NOW - 1_000, expire_at=NOW + 2 * REFRESH)
    assert next_step(pending, NOW, REFRESH) == Later(NOW - 1_000 + REFRESH)
    assert next_step(pending, NOW - 1_000 + REFRESH, REFRESH) == Deliver(NOW - 10)


def test_nothing_pending_is_replayed_only_when_acknowledged_and_asked() -> None:
    acked = entry(acked_at=NOW - 10, delivered_ms=NOW - 5)
    assert next_step(acked, NOW, REFRESH) is None
    assert next_step(acked, NOW, REFRESH, replay=True) == Replay(NOW - 10)
    assert next_step(entry(), NOW, REFRESH, replay=True) is None  # never acknowledged: nothing to replay


def test_a_pass_does_not_replay_what_was_delivered_since_it_began() -> None:
    acked = entry(acked_at=NOW - 10, delivered_ms=NOW - 5)
    # delivered at NOW - 5: a pass that began then or before has seen it go out; one that began later replays it
    assert next_step(acked, NOW, REFRESH, replay=True, replay_before_ms=NOW - 5) is None
    assert next_step(acked, NOW, REFRESH, replay=True, replay_before_ms=NOW - 6) is None
    assert next_step(acked, NOW, REFRESH, replay=True, replay_before_ms=NOW - 4) == Replay(NOW - 10)


def test_a_pending_version_is_delivered_before_any_replay() -> None:
    pending = entry(pending_at=NOW - 10, pending_change=True, acked_at=NOW - 20)
    assert next_step(pending, NOW, REFRESH, replay=True) == Deliver(NOW - 10)


@given(st.booleans(), st.booleans(), st.integers(min_value=0, max_value=10))
def test_an_expired_entry_is_never_sent(change: bool, replay: bool, past: int) -> None:
    expired = entry(expire_at=NOW - past, pending_at=NOW - 10, pending_change=change, acked_at=NOW - 10)
    assert next_step(expired, NOW, REFRESH, replay=replay) is None


def test_backoff_doubles_to_a_ceiling_and_the_lock_outlives_the_longest_delivery() -> None:
    settings = DeliverySettings(url="http://board.example/hook", retries=5, timeout_ms=10_000)
    assert [settings.backoff(n) for n in range(1, 7)] == [500, 1_000, 2_000, 4_000, 8_000, 8_000]
    assert settings.lock_ms > 5 * 10_000 + 500 + 1_000 + 2_000 + 4_000
