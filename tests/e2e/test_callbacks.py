"""Job callbacks across process deaths (SPEC S5.8): a replica SIGKILLed mid-delivery leaves the delivery to
another, and a Redis restart (AOF) loses no owed delivery. The receiver is a real HTTP server in this process
that verifies every signature with the `standardwebhooks` package."""

from __future__ import annotations

import base64
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from attrs import define, field
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from tests.conftest import RedisServer
from tests.e2e.conftest import BrokerFactory, BrokerProcess, SimulatorProcess, until

SECRET = "whsec_" + base64.b64encode(bytes(range(32))).decode()
FAST = {"RUNS_POLL_INTERVAL": "200", "RUNS_BACKOFF": "50", "RUNS_BACKOFF_MAX": "200"}
HELD = 0  #: the status recorded for a POST the receiver held and never answered


@define
class Call:
    body: bytes
    webhook_id: str
    verified: bool
    status: int


@define
class Hook:
    """What the receiver does: answer the next of `answers` (200 once they run out), or hold while `holding`."""

    url: str = ""
    calls: list[Call] = field(factory=list)
    answers: list[int] = field(factory=list)
    holding: threading.Event = field(factory=threading.Event)
    released: threading.Event = field(factory=threading.Event)
    lock: threading.Lock = field(factory=threading.Lock)

    def answer(self, body: bytes, headers: dict[str, str]) -> int:
        try:
            Webhook(SECRET).verify(body, headers, json_parse=False)
            verified = True
        except WebhookVerificationError:
            verified = False
        with self.lock:
            status = HELD if self.holding.is_set() else (self.answers.pop(0) if self.answers else 200)
            self.calls.append(Call(body, headers.get("webhook-id", ""), verified, status))
        if status == HELD:
            self.released.wait(30)
            return 200
        return status


@pytest.fixture
def hook() -> Iterator[Hook]:
    state = Hook()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            headers = {name.lower(): value for name, value in self.headers.items()}
            status = state.answer(body, headers)
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *args: Any) -> None:
            pass

    class Server(ThreadingHTTPServer):
        daemon_threads = True

        def handle_error(self, request: Any, client_address: Any) -> None:
            pass  # the answer to a killed broker finds its connection gone

    server = Server(("127.0.0.1", 0), Handler)
    state.url = f"http://127.0.0.1:{server.server_address[1]}/hook"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield state
    state.released.set()
    server.shutdown()
    server.server_close()


def _env(simulator: SimulatorProcess) -> dict[str, str]:
    return {
        **FAST,
        "HERMES_URL": simulator.url,
        "CALLBACK_ALLOWED_HOSTS": "127.0.0.1",
        "CALLBACK_SIGNING_SECRET": SECRET,
        "BOARD_TIMEOUT": "1500",  # one attempt's timeout: a claim lapses 2 s after it
    }


def _create(broker: BrokerProcess, hook: Hook) -> str:
    status, body = broker.request("POST", "/v1/runs", {"input": "hello", "callback": {"url": hook.url}})
    assert status == 202, body
    return str(body["run_id"])


def _callback(broker: BrokerProcess, job_id: str) -> dict[str, Any]:
    status, body = broker.request("GET", f"/v1/runs/{job_id}")
    assert status == 200, body
    callback: dict[str, Any] = body["callback"]
    return callback


def test_a_replica_killed_mid_delivery_leaves_the_callback_to_another(
    start_broker: BrokerFactory, clean_redis: RedisServer, simulator: SimulatorProcess, hook: Hook
) -> None:
    # Given a replica whose first callback POST the receiver holds unanswered
    hook.holding.set()
    doomed = start_broker(redis_url=clean_redis.url, **_env(simulator))
    job_id = _create(doomed, hook)
    until(lambda: hook.calls, 20, "the first POST")
    # When that replica is SIGKILLed mid-delivery, and another one runs
    doomed.kill()
    hook.holding.clear()
    hook.released.set()
    survivor = start_broker(redis_url=clean_redis.url, **_env(simulator))
    # Then the other replica delivers the same callback, and the job shows it delivered
    until(lambda: _callback(survivor, job_id)["status"] == "delivered", 30, "delivered")
    held, *rest = hook.calls
    assert held.status == HELD and rest and rest[-1].status == 200
    assert {call.webhook_id for call in hook.calls} == {f"{job_id}:job.completed:1"}
    assert {call.body for call in hook.calls} == {held.body}
    assert all(call.verified for call in hook.calls)


def test_a_stopping_replica_hands_its_delivery_over_at_once(
    start_broker: BrokerFactory, clean_redis: RedisServer, simulator: SimulatorProcess, hook: Hook
) -> None:
    # Given a replica whose callback POST the receiver holds, with a timeout (and so a claim) of a minute
    hook.holding.set()
    env = {**_env(simulator), "BOARD_TIMEOUT": "60000"}
    leaving = start_broker(redis_url=clean_redis.url, **env)
    job_id = _create(leaving, hook)
    until(lambda: hook.calls, 20, "the first POST")
    # When it is SIGTERMed (a rollout) and another replica runs
    assert leaving.terminate() == 0
    hook.holding.clear()
    hook.released.set()
    staying = start_broker(redis_url=clean_redis.url, **env)
    # Then the other one delivers well before the claim would have lapsed
    until(lambda: _callback(staying, job_id)["status"] == "delivered", 20, "delivered")
    assert {call.webhook_id for call in hook.calls} == {f"{job_id}:job.completed:1"}


def test_an_owed_callback_survives_a_redis_restart(
    start_broker: BrokerFactory,
    simulator: SimulatorProcess,
    hook: Hook,
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Given a broker on a Redis of its own (AOF, fsync always), and a receiver that fails the first POST
    server = RedisServer(tmp_path_factory.mktemp("callback-redis"))
    server.start()
    try:
        hook.answers = [503]
        broker = start_broker(redis_url=server.url, **_env(simulator))
        job_id = _create(broker, hook)
        until(lambda: hook.calls, 20, "the failed POST")
        # When Redis is killed before the retry and comes back on the same port and files
        server.stop(kill=True)
        server.start()
        # Then the retry still comes, the same delivery, and the job shows it delivered after two attempts
        until(lambda: _callback(broker, job_id)["status"] == "delivered", 40, "delivered")
        assert [call.status for call in hook.calls] == [503, 200]
        assert hook.calls[0].webhook_id == hook.calls[1].webhook_id == f"{job_id}:job.completed:1"
        assert hook.calls[0].body == hook.calls[1].body and all(call.verified for call in hook.calls)
        callback = _callback(broker, job_id)
        assert (callback["attempts"], callback["last_error"]) == (2, "HTTP 503")
    finally:
        server.stop()
