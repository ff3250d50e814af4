"""test_fairness.py's properties again with `ADMISSION_FAIRNESS_COST=runs` (SPEC S4.2: one turn per job, every job
in the line at a fixed tag), both backends."""

from __future__ import annotations

import pytest
from attrs import evolve

from broker.config import Config
from tests.conftest import BOTH_BACKENDS
from tests.integration.driver.test_fairness import (
    test_a_late_key_starts_within_about_one_round_not_after_the_backlog,
    test_a_line_written_by_the_previous_broker_is_driven_to_the_end_first,
    test_a_stop_of_a_waiting_job_of_any_key_is_immediate,
    test_keys_arriving_one_after_another_each_start_within_about_one_round,
    test_one_job_keys_that_share_a_turn_go_in_arrival_order,
    test_strict_priority_then_fair_turns_each_key_in_arrival_order,
    test_two_replicas_keep_one_fair_order,
)

pytestmark = BOTH_BACKENDS

__all__ = [
    "test_a_late_key_starts_within_about_one_round_not_after_the_backlog",
    "test_a_line_written_by_the_previous_broker_is_driven_to_the_end_first",
    "test_a_stop_of_a_waiting_job_of_any_key_is_immediate",
    "test_keys_arriving_one_after_another_each_start_within_about_one_round",
    "test_one_job_keys_that_share_a_turn_go_in_arrival_order",
    "test_strict_priority_then_fair_turns_each_key_in_arrival_order",
    "test_two_replicas_keep_one_fair_order",
]


@pytest.fixture
def config(redis_target: tuple[str, bool]) -> Config:
    url, cluster = redis_target
    return evolve(Config(redis_url=url, redis_cluster=cluster, runs_event_block_ms=500), admission_fairness_cost="runs")
