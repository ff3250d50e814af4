"""The line's messages on the signals channel (broker/store/signals.py): `line J`, and `new S A J` for a job that
started at the virtual time (SPEC S4.2); anything else is a nudge."""

from __future__ import annotations

from broker.store import signals


def test_a_newcomers_message_names_its_job_place_and_advance() -> None:
    message = signals.newcomer_message("run_abc", 2**51 + 7, 10_000)
    assert message == "new 2251799813685255 10000 run_abc"
    assert signals.newcomer(message) == ("run_abc", 2**51 + 7, 10_000)
    assert signals.joined(message) == "run_abc"


def test_a_line_message_is_no_newcomer_and_a_nudge_neither() -> None:
    assert signals.joined(signals.joined_message("run_abc")) == "run_abc"
    assert signals.newcomer(signals.joined_message("run_abc")) is None
    for nudge in ("run_abc", "new run_abc", "new x 1 run_abc", "new 1 -5 run_abc", "new 1 2"):
        assert signals.newcomer(nudge) is None and signals.joined(nudge) is None, nudge
