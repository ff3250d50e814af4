"""What a replica knows of the slots it wrote (broker/admission/known_slots.py): a write is skipped only where the
replica's own earlier write makes it so already."""

from __future__ import annotations

from broker.admission.known_slots import KnownSlots

TTL = 15_000


def test_a_slot_granted_here_less_than_half_a_ttl_ago_on_that_upstream_is_fresh_once() -> None:
    slots = KnownSlots()
    slots.granted("a", "h1", 1_000)
    slots.granted("b", "h1", 1_000)
    slots.granted("c", "h1", 1_000)
    assert slots.fresh("a", "h1", 1_000 + TTL // 2 - 1, TTL)
    assert not slots.fresh("a", "h1", 1_001, TTL)  # asked once: forgotten
    assert not slots.fresh("b", "h1", 1_000 + TTL // 2, TTL)
    assert not slots.fresh("c", "h2", 1_001, TTL)
    assert not slots.fresh("d", "h1", 1_001, TTL)  # never granted here (taken over)


def test_only_a_job_whose_acceptance_was_written_here_has_no_create_in_flight() -> None:
    slots = KnownSlots()
    assert slots.in_flight("a")
    slots.accepted("a")
    assert not slots.in_flight("a")
    assert slots.in_flight("a")  # released: forgotten
    slots.accepted("b")
    slots.granted("b", "h1", 1_000)  # granted again (back in line, then granted): its create is in flight again
    assert slots.in_flight("b")
    slots.accepted("c")
    slots.forget("c")  # refused, requeued
    assert slots.in_flight("c")
