"""A schema-driven fuzzer (Schemathesis) against a running broker and the Hermes simulator (SPEC S3.8): every
documented operation, and chains of them along the document's links (create -> get -> events -> stop ->
approval), then what fuzzing rarely reaches (a live approval, a relayed Hermes run). Every answer must conform
to the document (status, content type, headers, body, each event of a stream), none may be a 5xx, and a request
that breaks the document must be refused."""

from __future__ import annotations

import json
import os
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from attrs import define
from hypothesis import HealthCheck, settings
from hypothesis.stateful import run_state_machine_as_test
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    allow_header_conformance,
    content_type_conformance,
    ensure_resource_availability,
    negative_data_rejection,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
    unsupported_method,
)

from broker.config import _VARIABLES
from broker.http.openapi import document
from tests.conftest import RedisServer, free_port
from tests.e2e.conftest import BrokerProcess, SimulatorProcess, until

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,  # a request that breaks the document is refused
    unsupported_method,  # an undocumented method answers 405 ...
    allow_header_conformance,  # ... with an Allow header naming the documented ones
    ensure_resource_availability,  # a created job can be read at once, on the link's operations
]
API_KEY = "fuzz-key-0123456789abcdef"
EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "100"))  #: cases per operation (and 2/5 as many chains)
FUZZ_TIMEOUT_S = 120 * max(1, EXAMPLES // 100)  #: each fuzzing test takes 5-15 s on a quiet machine
REQUEST_TIMEOUT_S = 10.0  #: an event stream of a job that is not over would run on: every fuzzed job ends quickly
FUZZ = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    derandomize=not os.environ.get("FUZZ_RANDOM"),  # the same cases on every run, unless FUZZ_RANDOM=1
    database=None,
)


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Services]:
    """A redis-server and an uncapped simulator for the brokers of this module."""
    folder = tmp_path_factory.mktemp("openapi-fuzz")
    redis = RedisServer(folder)
    redis.start()
    # with a key, as Hermes 0.19.0 is run: without one it refuses X-Hermes-Session-Key, and the line would wait
    simulator = SimulatorProcess(free_port(), api_key=API_KEY)
    yield Services(folder, redis, simulator)
    simulator.process.terminate()
    simulator.process.wait(timeout=10)
    redis.stop()


@pytest.fixture(scope="module")
def fuzzed_broker(services: Services) -> Iterator[BrokerProcess]:
    """One broker for every case of this module."""
    broker = services.broker()
    yield broker
    broker.terminate()
    _show_errors(broker.log_path)


@define
class Services:
    folder: Path
    redis: RedisServer
    simulator: SimulatorProcess

    def broker(self, **variables: str) -> BrokerProcess:
        env = {name: value for name, value in os.environ.items() if name not in _VARIABLES}
        env.update(
            HOST="127.0.0.1",
            PORT=str(free_port()),
            REDIS_URL=self.redis.url,
            HERMES_URL=self.simulator.url,
            HERMES_API_KEY=API_KEY,
            RUNS_EVENT_BLOCK="1000",
            SHUTDOWN_GRACE="3000",
            LOG_LEVEL="info",
            PYTHONUNBUFFERED="1",
            **variables,
        )
        return BrokerProcess(env, self.folder / f"broker-{env['PORT']}.log").start()


@pytest.fixture(scope="module")
def broker_schema(fuzzed_broker: BrokerProcess) -> Any:
    """The document the broker serves, aimed at that broker."""
    return schemathesis.openapi.from_url(f"{fuzzed_broker.url}/openapi.json")


schema = schemathesis.pytest.from_fixture("broker_schema")


@pytest.mark.timeout(FUZZ_TIMEOUT_S)
@schema.parametrize()
@FUZZ
def test_every_answer_conforms_to_the_document(case: schemathesis.Case) -> None:
    case.call_and_validate(checks=CHECKS, timeout=REQUEST_TIMEOUT_S)


@pytest.mark.timeout(FUZZ_TIMEOUT_S)
def test_linked_operations_conform_to_the_document(broker_schema: Any) -> None:
    """Chains along the links: a created job is read, streamed, stopped and approved."""

    class Links(broker_schema.as_state_machine()):  # type: ignore[misc]
        def get_call_kwargs(self, case: schemathesis.Case) -> dict[str, Any]:
            return {"timeout": REQUEST_TIMEOUT_S}

        def validate_response(self, response: Any, case: schemathesis.Case, *_: Any, **__: Any) -> None:
            case.validate_response(response, checks=CHECKS)

    run_state_machine_as_test(
        Links, settings=settings(FUZZ, max_examples=max(1, EXAMPLES * 2 // 5), stateful_step_count=8)
    )


def test_a_live_approval_and_its_event_stream_conform_to_the_document(
    fuzzed_broker: BrokerProcess, broker_schema: Any
) -> None:
    """What fuzzed inputs rarely reach: a run that waits for an approval (the simulator's `approval` marker)."""
    # Given a job whose run waits for an approval
    status, job = fuzzed_broker.request("POST", "/v1/runs", {"input": "approval", "session_id": "openapi-approval"})
    assert status == 202
    path = f"/v1/runs/{job['run_id']}"
    until(lambda: fuzzed_broker.request("GET", path)[1]["status"] == "waiting_for_approval", 10, "the approval prompt")
    # When it is read, approved and streamed to its end
    run = {"run_id": job["run_id"]}
    cases = [
        broker_schema["/v1/runs/{run_id}"]["GET"].Case(path_parameters=run),
        broker_schema["/v1/runs/{run_id}/approval"]["POST"].Case(
            path_parameters=run, body={"choice": "once"}, media_type="application/json"
        ),
        broker_schema["/v1/runs/{run_id}/events"]["GET"].Case(path_parameters=run),
        broker_schema["/v1/runs/{run_id}/approval"]["POST"].Case(
            path_parameters=run, body={"choice": "deny"}, media_type="application/json"
        ),
        broker_schema["/v1/runs/{run_id}/stop"]["POST"].Case(path_parameters=run),
    ]
    # Then every answer conforms: the approval's 200, each event of the stream, the finished job's 409 and stop
    statuses = [case.call_and_validate(checks=CHECKS, timeout=REQUEST_TIMEOUT_S).status_code for case in cases]
    assert statuses == [200, 200, 200, 409, 200]


def test_a_relayed_hermes_run_conforms_to_the_document(services: Services, broker_schema: Any) -> None:
    """With RUNS_PROXY_ENABLED a run created on Hermes directly is answered by Hermes, through the broker."""
    # Given a run that lives on Hermes only, and a broker that relays such runs
    proxy = services.broker(RUNS_PROXY_ENABLED="true")
    try:
        created = urllib.request.Request(
            f"{services.simulator.url}/v1/runs",
            data=json.dumps({"input": "sleep:1"}).encode(),
            headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(created, timeout=5) as answer:
            run = {"run_id": json.loads(answer.read())["run_id"]}
        # When it is read, streamed and stopped through the broker, and an approval is sent for it
        cases = [
            broker_schema["/v1/runs/{run_id}"]["GET"].Case(path_parameters=run),
            broker_schema["/v1/runs/{run_id}/events"]["GET"].Case(path_parameters=run),
            broker_schema["/v1/runs/{run_id}/stop"]["POST"].Case(path_parameters=run),
            broker_schema["/v1/runs/{run_id}/approval"]["POST"].Case(
                path_parameters=run, body={"choice": "once"}, media_type="application/json"
            ),
        ]
        # Then each relayed answer (Hermes's run object, its stream without ids, its errors) conforms
        answers = [
            case.call_and_validate(base_url=proxy.url, checks=CHECKS, timeout=REQUEST_TIMEOUT_S) for case in cases
        ]
        assert [answer.status_code for answer in answers[:2]] == [200, 200]
    finally:
        proxy.terminate()
        _show_errors(proxy.log_path)


def test_the_served_document_is_the_one_the_code_builds(fuzzed_broker: BrokerProcess) -> None:
    assert fuzzed_broker.request("GET", "/openapi.json") == (200, document())


def _show_errors(log: Path) -> None:
    """Error lines of the broker's log go to stderr, so a failure's traceback is in the test's output."""
    errors = [line for line in log.read_text().splitlines() if '"level":"ERROR"' in line or "Traceback" in line]
    if errors:
        print("\n".join(errors[-20:]), file=sys.stderr)
