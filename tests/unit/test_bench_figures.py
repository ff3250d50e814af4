"""The benchmark's own arithmetic: wrk's output, percentiles, the table (scripts/benchlib)."""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from benchlib.figures import Row, markdown, percentile
from benchlib.load import create_body, parse_wrk
from benchlib.turns import Handover, Job, due, handovers, job_times, lateness, out_of_order, overlaps
from benchlib.upstream_logs import (
    accepted_per_attempt,
    job_of,
    on_own_upstream,
    ran_twice,
    runs_per_key,
    spread,
    started_runs,
)

WRK_OUTPUT = """Running 3s test @ http://127.0.0.1:40000
  2 threads and 64 connections
  Thread Stats   Avg      Stdev     Max   +/- Stdev
    Latency    12.01ms    3.02ms  40.11ms   80.00%
  Latency Distribution
     50%   11.10ms
     75%   13.00ms
     90%   15.20ms
     99%    1.25s
  15912 requests in 3.00s, 9.10MB read
  Socket errors: connect 0, read 2, write 0, timeout 1
  Non-2xx or 3xx responses: 4
Requests/sec:   5303.71
Transfer/sec:      3.03MB
"""


def test_wrk_output_gives_rate_latencies_and_failures() -> None:
    result = parse_wrk(WRK_OUTPUT)
    assert (result.rate, result.p50_ms, result.p99_ms) == (5303.71, 11.1, 1250.0)
    assert (result.requests, result.failed) == (15912, 7)


def test_percentile_is_nearest_rank() -> None:
    values = [float(n) for n in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (50.0, 99.0, 100.0)
    assert percentile([3.0], 99) == 3.0


def test_the_table_shows_median_range_and_ratio_and_escapes_pipes() -> None:
    rows = [Row("create c8", "req/s", [1.0, 3.0, 2.0], [4.0, 4.0]), Row("a|b", "KB", [5.0], target="target 2.5 KB")]
    lines = markdown(rows).splitlines()
    assert lines[2] == "| create c8 | req/s | 2.00 (1.00-3.00, n=3) | 4.00 (4.00-4.00, n=2) | 0.50x |"
    assert lines[3] == "| a\\|b | KB | 5.00 (n=1) | target 2.5 KB | - |"


def test_the_create_body_is_about_724_bytes_with_a_context_of_three_links_and_no_session() -> None:
    body = orjson.loads(create_body())
    assert len(create_body()) == 724
    assert len(body["context"]["links"]) == 3 and body["context"]["title"]
    assert "session_id" not in body  # a row's jobs would otherwise be turns of one session, run one at a time


def _create(key: str | None, status: int | None, run_id: str | None = None) -> dict[str, object]:
    entry: dict[str, object] = {"method": "POST", "path": "/v1/runs", "status": status, "idempotency_key": key}
    if run_id is not None:
        entry["run_id"] = run_id
    return entry


def test_a_simulator_log_counts_only_creates_that_started_a_run_by_their_key() -> None:
    log = [_create("job_a", 202, "run_1"), _create("job_b", 429), _create("job_c", None),
           {"method": "GET", "path": "/v1/runs/run_1", "status": 200, "idempotency_key": None},
           _create("job_a#2", 202, "run_2")]  # fmt: skip
    assert started_runs(log) == [("job_a", "run_1"), ("job_a#2", "run_2")]
    assert job_of("job_a#2") == job_of("job_a") == "job_a"


def test_a_key_that_started_runs_on_two_simulators_ran_twice() -> None:
    first, second = [_create("job_a", 202, "run_1"), _create("job_b", 202, "run_2")], [_create("job_a#2", 202, "r3")]
    assert ran_twice([first, second]) == {}
    assert runs_per_key([first, second]) == {"job_a": 1, "job_b": 1, "job_a#2": 1}
    assert ran_twice([first, second, [_create("job_b", 202, "run_4")]]) == {"job_b": 2}


def test_turns_count_on_the_upstream_most_of_their_session_ran_on() -> None:
    assert on_own_upstream({"s1": ["a", "a", "a", "a"], "s2": ["b"] * 4}) == 8
    assert on_own_upstream({"s1": ["a", "b", "a", "a"], "s2": ["b", None, "b", "b"]}) == 6
    assert spread({"s1": "a", "s2": "c", "s3": "c"}, ["a", "b", "c"]) == "1/0/2"


def test_a_jobs_accepted_events_are_counted_per_attempt() -> None:
    events = [{"event": "job.queued"}, {"event": "job.accepted", "attempt": 1}, {"event": "job.interrupted"},
              {"event": "job.accepted", "attempt": 2}, {"event": "run.completed", "attempt": 2}]  # fmt: skip
    assert accepted_per_attempt(events) == {1: 1, 2: 1}
    assert max(accepted_per_attempt([*events, {"event": "job.accepted", "attempt": 2}]).values()) == 2


def _accepted_and_end(start: float, end: float, terminal: str = "run.completed") -> list[dict[str, object]]:
    return [{"event": "job.queued", "timestamp": 0.5}, {"event": "job.accepted", "timestamp": start, "attempt": 1},
            {"event": "job.interrupted", "timestamp": start + 0.1}, {"event": "job.accepted", "timestamp": start + 0.2},
            {"event": terminal, "timestamp": end}]  # fmt: skip


def test_a_job_runs_from_its_first_acceptance_to_its_terminal_event() -> None:
    assert job_times(1.0, _accepted_and_end(2.0, 5.0)) == Job(1.0, 2.0, 5.0)
    assert job_times(1.0, _accepted_and_end(2.0, 3.0, "run.cancelled")).end == 3.0
    with pytest.raises(ValueError, match=r"job\.accepted"):
        job_times(1.0, [{"event": "run.failed", "timestamp": 2.0}])
    with pytest.raises(ValueError, match="terminal"):
        job_times(1.0, _accepted_and_end(2.0, 3.0)[:2])


def test_turns_overlap_pairwise_unless_one_starts_when_the_other_ended() -> None:
    one, two, three = Job(0, 1, 2), Job(0, 2, 3), Job(0, 2.5, 4)
    assert overlaps([one, two]) == 0
    assert overlaps([one, two, three]) == 1
    assert overlaps([Job(0, 1, 9), two, three]) == 3
    assert not out_of_order([one, two, three]) and out_of_order([one, three, two])


def test_a_turn_is_due_once_its_session_is_free_and_the_jobs_created_before_it_started() -> None:
    first, second = Job(0.0, 1.0, 2.0), Job(0.5, 6.0, 7.0)
    before, early_after, late_after = Job(0.2, 3.0, 4.0), Job(0.7, 2.5, 3.5), Job(0.8, 4.5, 5.0)
    others = [first, second, before, early_after, late_after, Job(0.1, 0.5, 1.5), Job(0.4, 9.0, 10.0)]
    assert due(second, others, free_at=first.end) == 3.0
    assert handovers([first, second], others, grace_s=1.0) == [Handover(gap=4.0, late=3.0, overtaken=True)]
    assert handovers([first, second], others, grace_s=2.0)[0].overtaken is False
    assert handovers([first], others, grace_s=1.0) == []
    assert lateness([before, Job(0.3, 0.35, 1.0)], others) == [3.0 - 1.0, 0.35 - 0.3]
