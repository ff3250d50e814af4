"""test_fairness.py's order properties again with `ADMISSION_FAIRNESS_COST=time` (SPEC S4.2 "What a turn costs": the
order within a key, strict priority, resubmits first and a stop of a waiting job are unchanged), both backends.

Left out: the late key and the two replicas' late key (test_fairness.py), which time does not meet yet: a backlog's
first runs are charged the guess, V moves past those estimated tags, and the settles' corrections leave the backlogged
key a credit below V that a late key waits behind (about slots x (guess - run) / run of the backlog's runs)."""

from __future__ import annotations

import pytest
from attrs import evolve

from broker.config import Config
from tests.conftest import BOTH_BACKENDS
from tests.integration.driver.test_fairness import (
    test_a_line_written_by_the_previous_broker_is_driven_to_the_end_first,
    test_a_stop_of_a_waiting_job_of_any_key_is_immediate,
    test_one_job_keys_that_share_a_turn_go_in_arrival_order,
    test_strict_priority_then_fair_turns_each_key_in_arrival_order,
)

pytestmark = BOTH_BACKENDS

__all__ = [
    "test_a_line_written_by_the_previous_broker_is_driven_to_the_end_first",
    "test_a_stop_of_a_waiting_job_of_any_key_is_immediate",
    "test_one_job_keys_that_share_a_turn_go_in_arrival_order",
    "test_strict_priority_then_fair_turns_each_key_in_arrival_order",
]


@pytest.fixture
def config(redis_target: tuple[str, bool]) -> Config:
    url, cluster = redis_target
    return evolve(Config(redis_url=url, redis_cluster=cluster, runs_event_block_ms=500), admission_fairness_cost="time")
