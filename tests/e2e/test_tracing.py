"""One trace per job (SPEC S6.1), exported by broker processes to a real OTLP/HTTP receiver: from the create
(continuing the caller's traceparent) through admission, Hermes calls (traceparent sent to Hermes), follows, a
resubmit, a stop, board deliveries and a takeover by another replica; never a prompt in an attribute."""

from __future__ import annotations

import json
import os
import secrets
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from broker import tracing
from broker.driver.prober import PROBE_RUN
from broker.store import keys
from tests.conftest import RedisServer
from tests.e2e.conftest import BrokerFactory, BrokerProcess, SimulatorProcess, until
from tests.e2e.otlp import OtlpReceiver, ReceivedSpan

FAST = {"RUNS_POLL_INTERVAL": "200", "RUNS_BACKOFF": "50", "RUNS_BACKOFF_MAX": "200"}
JSON = {"Content-Type": "application/json"}
INSTANCE = "service.instance.id"


@pytest.fixture
def otlp() -> Iterator[OtlpReceiver]:
    receiver = OtlpReceiver()
    yield receiver
    receiver.close()


def traced(receiver: OtlpReceiver) -> dict[str, str]:
    """OpenTelemetry's own variables: export to the receiver, in batches every 100 ms."""
    return {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.url, "OTEL_BSP_SCHEDULE_DELAY": "100"}


def create(broker: BrokerProcess, text: str, **headers: str) -> str:
    status, body = broker.request("POST", "/v1/runs", {"input": text, "instructions": text}, **JSON, **headers)
    assert status == 202, body
    return str(body["run_id"])


def job(broker: BrokerProcess, job_id: str) -> dict[str, Any]:
    return dict(broker.request("GET", f"/v1/runs/{job_id}")[1])


def hermes_requests(simulator: SimulatorProcess) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{simulator.url}/_sim/requests", timeout=5) as answer:
        return list(json.loads(answer.read())["requests"])


def trace_of(receiver: OtlpReceiver, job_id: str) -> list[ReceivedSpan]:
    """Every span of the trace the job's create began (empty until the create's span arrived)."""
    spans = receiver.spans()
    roots = [s for s in spans if s.name == tracing.CREATE and s.attributes.get(tracing.JOB) == job_id]
    return [s for s in spans if roots and s.trace_id == roots[0].trace_id]


def named(spans: list[ReceivedSpan], name: str) -> list[ReceivedSpan]:
    return [s for s in spans if s.name == name]


def one(spans: list[ReceivedSpan], name: str) -> ReceivedSpan:
    found = named(spans, name)
    assert len(found) == 1, (name, found)
    return found[0]


def has(receiver: OtlpReceiver, job_id: str, *names: str, follows: int = 1) -> list[ReceivedSpan] | None:
    spans = trace_of(receiver, job_id)
    present = {s.name for s in spans}
    return spans if set(names) <= present and len(named(spans, tracing.FOLLOW)) >= follows else None


def parent_of(traceparent: str | None) -> tuple[str, str]:
    """(trace id, parent span id) of a W3C traceparent header."""
    assert traceparent is not None
    version, trace_id, span_id, _flags = traceparent.split("-")
    assert version == "00"
    return trace_id, span_id


def test_a_job_is_one_trace_from_the_callers_create_through_a_resubmit_to_its_board_deliveries(
    start_broker: BrokerFactory, clean_redis: RedisServer, simulator: SimulatorProcess, otlp: OtlpReceiver
) -> None:
    # Given a replica exporting traces, with board reports on, and a caller that sends its own trace context
    board = {"BOARD_ENABLED": "true", "BOARD_URL": f"{otlp.url}/board"}
    broker = start_broker(redis_url=clean_redis.url, **FAST, **traced(otlp), **board, HERMES_URL=simulator.url)
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    secret = f"prompt-{secrets.token_hex(8)}"  # the input and instructions: never in an attribute
    job_id = create(broker, f"{secret} sleep:3", traceparent=f"00-{caller_trace}-{caller_span}-01")
    until(lambda: job(broker, job_id)["status"] == "running", 15, "the job running")
    # When Hermes restarts and forgets the run (the job is resubmitted as attempt 2) and the job then completes
    urllib.request.urlopen(urllib.request.Request(f"{simulator.url}/_sim/restart", b"{}", JSON), timeout=5).read()
    until(lambda: job(broker, job_id)["status"] == "completed", 30, "the job completed")
    assert job(broker, job_id)["attempts"] == 2
    names = (tracing.CREATE, tracing.ADMISSION, "hermes.create", tracing.FOLLOW, "hermes.events", "hermes.get")
    spans = until(lambda: has(otlp, job_id, *names, tracing.RESUBMIT, tracing.BOARD, follows=2), 20, "the spans")

    # Then every span of the job is in the caller's trace, and every span of that trace is the job's
    assert {s.trace_id for s in otlp.spans() if s.attributes.get(tracing.JOB) == job_id} == {caller_trace}
    assert {s.trace_id for s in spans} == {caller_trace}
    assert {s.attributes.get(tracing.JOB) for s in spans} == {job_id}
    root = one(spans, tracing.CREATE)
    assert (root.kind, root.parent_span_id, root.attributes["http.route"]) == ("server", caller_span, "/v1/runs")
    # admission waits, Hermes creates and follows per attempt, with the Hermes run ids and the upstream
    upstream = simulator.url.removeprefix("http://")
    creates = {s.attributes[tracing.ATTEMPT]: s for s in named(spans, "hermes.create")}
    assert set(creates) == {1, 2}
    runs = {attempt: span.attributes[tracing.RUN] for attempt, span in creates.items()}
    assert runs[1] != runs[2]
    assert {s.attributes["hermes.idempotency_key"] for s in creates.values()} == {job_id, f"{job_id}#2"}
    assert all(s.kind == "client" and s.attributes[tracing.UPSTREAM] == upstream for s in creates.values())
    assert all(s.parent_span_id == root.span_id for s in creates.values())
    assert {s.attributes[tracing.ATTEMPT] for s in named(spans, tracing.ADMISSION)} == {1, 2}
    assert all(s.parent_span_id == root.span_id for s in named(spans, tracing.ADMISSION))
    follows = {s.attributes[tracing.ATTEMPT]: s for s in named(spans, tracing.FOLLOW)}
    assert {attempt: s.attributes[tracing.RUN] for attempt, s in follows.items()} == runs
    assert follows[2].attributes[tracing.STATUS] == "completed"
    for stream in named(spans, "hermes.events"):  # each attempt's event stream within its follow
        attempt = stream.attributes[tracing.ATTEMPT]
        assert (stream.parent_span_id, stream.attributes[tracing.RUN]) == (follows[attempt].span_id, runs[attempt])
    resubmit = one(spans, tracing.RESUBMIT)
    assert (resubmit.attributes[tracing.ATTEMPT], resubmit.attributes[tracing.RUN]) == (2, runs[1])
    deliveries = named(spans, tracing.BOARD)
    assert all(s.parent_span_id == root.span_id and s.kind == "client" for s in deliveries)
    # no attribute of any span (nor of the process) holds the input
    for span in otlp.spans():
        assert secret not in repr(span.attributes) and secret not in repr(span.resource)
    # and Hermes got the trace context on every call of the job, each call's own span as the parent
    calls = [r for r in hermes_requests(simulator) if r["path"].startswith("/v1/runs") and PROBE_RUN not in r["path"]]
    assert calls and all(parent_of(r["traceparent"])[0] == caller_trace for r in calls)
    sent = {parent_of(r["traceparent"])[1] for r in calls if r["method"] == "POST" and r["path"] == "/v1/runs"}
    assert sent == {s.span_id for s in creates.values()}


def test_a_job_held_by_a_busy_hermes_waits_in_admission_spans_that_say_so(
    start_broker: BrokerFactory, clean_redis: RedisServer, simulator: SimulatorProcess, otlp: OtlpReceiver
) -> None:
    # Given a traced replica and a Hermes that answers 429 to every create
    settings = f"{simulator.url}/_sim/settings"
    urllib.request.urlopen(urllib.request.Request(settings, b'{"busy": true}', JSON), timeout=5).read()
    broker = start_broker(redis_url=clean_redis.url, **FAST, **traced(otlp), HERMES_URL=simulator.url)
    job_id = create(broker, "held")
    until(lambda: (job(broker, job_id).get("hold") or {}).get("reason") == "busy", 15, "the job held")
    # When Hermes takes creates again and the job completes
    urllib.request.urlopen(urllib.request.Request(settings, b'{"busy": false}', JSON), timeout=5).read()
    until(lambda: job(broker, job_id)["status"] == "completed", 15, "the job completed")
    spans = until(lambda: has(otlp, job_id, tracing.ADMISSION, "hermes.create", tracing.FOLLOW), 20, "the spans")
    # Then each grant's wait is a span from the job's entry into the line; the refused creates say 429
    waits = named(spans, tracing.ADMISSION)
    assert len(waits) >= 2 and {s.attributes.get("job.hold") for s in waits} == {None, "busy"}
    assert len({s.start_ns for s in waits}) == 1  # every wait began when the job entered the line
    creates = named(spans, "hermes.create")
    statuses = sorted(s.attributes["http.response.status_code"] for s in creates)
    assert statuses[0] == 202 and set(statuses[1:]) == {429}
    assert all(tracing.RUN not in s.attributes for s in creates if s.attributes["http.response.status_code"] == 429)


def test_a_stop_is_a_span_of_the_jobs_trace_linked_to_the_callers(
    start_broker: BrokerFactory, clean_redis: RedisServer, simulator: SimulatorProcess, otlp: OtlpReceiver
) -> None:
    # Given a traced replica driving a long job created without a caller's trace context
    broker = start_broker(redis_url=clean_redis.url, **FAST, **traced(otlp), HERMES_URL=simulator.url)
    job_id = create(broker, "long sleep:60")
    until(lambda: job(broker, job_id)["status"] == "running", 15, "the job running")
    # When a caller with its own trace stops it
    caller_trace, caller_span = secrets.token_hex(16), secrets.token_hex(8)
    status, _ = broker.request("POST", f"/v1/runs/{job_id}/stop", traceparent=f"00-{caller_trace}-{caller_span}-01")
    assert status == 200
    until(lambda: job(broker, job_id)["status"] == "cancelled", 15, "the job cancelled")
    spans = until(lambda: has(otlp, job_id, tracing.STOP, "hermes.stop", tracing.FOLLOW), 20, "the spans")
    # Then the create began a trace of its own, and the stop request and Hermes's stop are spans of it
    root = one(spans, tracing.CREATE)
    assert root.parent_span_id == ""
    stop = one(spans, tracing.STOP)
    assert (stop.parent_span_id, stop.kind, stop.attributes[tracing.STATUS]) == (root.span_id, "server", "stopping")
    assert stop.links == ((caller_trace, caller_span),)  # the caller's trace points here
    hermes_stop = one(spans, "hermes.stop")
    assert hermes_stop.attributes[tracing.RUN] == one(spans, tracing.FOLLOW).attributes[tracing.RUN]
    assert one(spans, tracing.FOLLOW).attributes[tracing.STATUS] == "cancelled"
    stops = [r for r in hermes_requests(simulator) if r["path"].endswith("/stop")]
    assert [parent_of(r["traceparent"]) for r in stops] == [(root.trace_id, hermes_stop.span_id)]


def test_an_approval_is_a_span_of_the_jobs_trace_and_the_parent_of_hermess_call(
    start_broker: BrokerFactory, clean_redis: RedisServer, simulator: SimulatorProcess, otlp: OtlpReceiver
) -> None:
    # Given a traced replica driving a job whose tool call waits for an approval
    broker = start_broker(redis_url=clean_redis.url, **FAST, **traced(otlp), HERMES_URL=simulator.url)
    job_id = create(broker, "approval")
    until(lambda: job(broker, job_id)["status"] == "waiting_for_approval", 15, "the job waiting for approval")
    # When a caller approves it once
    status, _ = broker.request("POST", f"/v1/runs/{job_id}/approval", {"choice": "once"}, **JSON)
    assert status == 200
    until(lambda: job(broker, job_id)["status"] == "completed", 15, "the job completed")
    spans = until(lambda: has(otlp, job_id, tracing.APPROVAL, "hermes.approval", tracing.FOLLOW), 20, "the spans")
    # Then the approval request is a child of the create, and Hermes's approval call a child of the request
    root, approval = one(spans, tracing.CREATE), one(spans, tracing.APPROVAL)
    assert (approval.parent_span_id, approval.attributes["approval.choice"]) == (root.span_id, "once")
    hermes_approval = one(spans, "hermes.approval")
    assert hermes_approval.parent_span_id == approval.span_id
    assert hermes_approval.attributes[tracing.RUN] == one(spans, "hermes.create").attributes[tracing.RUN]
    [call] = [r for r in hermes_requests(simulator) if r["path"].endswith("/approval")]
    assert parent_of(call["traceparent"]) == (root.trace_id, hermes_approval.span_id)


def test_a_job_taken_over_by_another_replica_stays_in_its_trace(
    start_broker: BrokerFactory, clean_redis: RedisServer, simulator: SimulatorProcess, otlp: OtlpReceiver
) -> None:
    # Given two traced replicas with a short lease; the first creates and drives a slow job
    env = {**FAST, **traced(otlp), "HERMES_URL": simulator.url, "RUNS_LEASE": "1500"}
    doomed = start_broker(redis_url=clean_redis.url, **env)
    job_id = create(doomed, "slow sleep:4")
    until(lambda: job(doomed, job_id)["status"] == "running", 15, "the job running")
    until(lambda: has(otlp, job_id, "hermes.create", follows=0), 10, "the first replica's spans exported")
    survivor = start_broker(redis_url=clean_redis.url, **env)
    # When the first replica is SIGKILLed mid-run (its follow span is never exported)
    doomed.kill()
    until(lambda: job(survivor, job_id)["status"] == "completed", 30, "the job completed")
    spans = until(lambda: has(otlp, job_id, tracing.TAKEOVER, tracing.FOLLOW), 20, "the survivor's spans")
    # Then the survivor's takeover, follow and polls are children of the create's span, in the same trace
    root = one(spans, tracing.CREATE)
    takeover, follow = one(spans, tracing.TAKEOVER), one(spans, tracing.FOLLOW)
    assert takeover.resource[INSTANCE] != root.resource[INSTANCE]
    assert takeover.resource[INSTANCE] == follow.resource[INSTANCE]
    assert takeover.parent_span_id == root.span_id and follow.parent_span_id == root.span_id
    run_id = one(spans, "hermes.create").attributes[tracing.RUN]
    assert takeover.attributes[tracing.RUN] == follow.attributes[tracing.RUN] == run_id
    assert (takeover.attributes[tracing.ATTEMPT], follow.attributes[tracing.STATUS]) == (1, "completed")
    polls = [s for s in named(spans, "hermes.get") if s.resource[INSTANCE] == follow.resource[INSTANCE]]
    assert polls and all(s.parent_span_id == follow.span_id for s in polls)
    gets = [r for r in hermes_requests(simulator) if r["method"] == "GET" and r["path"] == f"/v1/runs/{run_id}"]
    assert gets and {parent_of(r["traceparent"])[0] for r in gets} == {root.trace_id}


def test_without_otel_variables_nothing_is_traced(
    start_broker: BrokerFactory,
    clean_redis: RedisServer,
    simulator: SimulatorProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Given a replica with the otel extra installed but no OTEL_* configuration beyond a service name
    for name in [name for name in os.environ if name.startswith("OTEL_")]:
        monkeypatch.delenv(name)
    broker = start_broker(redis_url=clean_redis.url, **FAST, HERMES_URL=simulator.url, OTEL_SERVICE_NAME="broker")
    # When a job runs to its end, created with a caller's trace context
    job_id = create(broker, "quick", traceparent=f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01")
    until(lambda: job(broker, job_id)["status"] == "completed", 15, "the job completed")
    # Then no trace context is stored or sent to Hermes, and the broker said nothing of exporting
    client = redis.Redis.from_url(clean_redis.url, decode_responses=True)
    try:
        [(_, fields)] = client.xrange(keys.events(job_id), count=1)
    finally:
        client.close()
    assert "traceparent" not in json.loads(fields[keys.EVENT_FIELD])
    assert all(r["traceparent"] is None for r in hermes_requests(simulator))
    assert "Exporting traces." not in broker.log_path.read_text()
