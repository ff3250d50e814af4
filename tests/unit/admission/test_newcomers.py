"""What a replica heard of jobs that started at V, and how far its passes push V for them (SPEC S4.2)."""

from __future__ import annotations

from broker.admission.newcomers import Newcomers


def test_a_pass_pushes_v_by_the_newcomers_it_had_room_to_grant_and_keeps_a_round_of_the_rest() -> None:
    heard = Newcomers(5)
    for advance in (10_000, 10_000, 2_500, 10_000, 10_000, 10_000):
        heard.entered(3, advance)
    # a pass of 2 grants pushes two newcomers' worth (their average cost); up to `room` of the rest wait
    assert heard.push(3, 2, room=3) == 17_500
    assert heard.push(3, 5, room=3) == 26_250
    assert heard.push(3, 5, room=3) == 0
    assert heard.push(2, 5, room=3) == 0  # another priority heard nothing


def test_newcomers_heard_before_another_replica_moved_v_are_left_to_it() -> None:
    heard = Newcomers(5)
    heard.learnt([0, 0, 50_000, 0, 0])
    heard.entered(3, 10_000)
    heard.set(3, 60_000)
    heard.learnt([0, 0, 60_000, 0, 0])  # where this replica left it: its own
    assert heard.push(3, 1, room=1) == 10_000
    heard.entered(3, 10_000)
    heard.learnt([0, 0, 80_000, 0, 0])  # moved elsewhere since
    assert heard.push(3, 1, room=1) == 0
    heard.entered(7, 10_000)  # no such priority: ignored
    heard.entered(1, 0)
    assert heard.push(1, 1, room=1) == 0
