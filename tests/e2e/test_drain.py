"""SIGTERM drain (SPEC S3.8, S4): not ready at once, /readyz keeps answering 503 while in-flight requests
finish, they are answered, and the process exits within SHUTDOWN_GRACE, also when Redis froze."""

from __future__ import annotations

import signal
import socket
import subprocess
import time

import pytest

from tests.conftest import RedisServer
from tests.e2e.conftest import BrokerFactory, SimulatorProcess, until


def test_readyz_answers_503_while_an_in_flight_request_finishes(
    start_broker: BrokerFactory, redis_server: RedisServer
) -> None:
    broker = start_broker(redis_url=redis_server.url, SHUTDOWN_GRACE="10000")
    assert broker.request("GET", "/readyz")[0] == 200
    body = b'{"input": "slow upload"}'
    # Given a create whose body is still arriving
    upload = socket.create_connection(("127.0.0.1", broker.port), timeout=10)
    upload.sendall(b"POST /v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n")
    upload.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body[:5])
    # When the broker is told to stop
    assert broker.process is not None
    process = broker.process
    process.terminate()
    # Then readiness answers 503 (draining) while that request is in flight
    deadline = time.monotonic() + 5
    while True:
        status, report = broker.request("GET", "/readyz")
        if status == 503:
            break
        assert time.monotonic() < deadline, "never reported not ready"
        time.sleep(0.02)
    assert report["reason"] == "draining" and report["draining"] is True
    assert process.poll() is None
    # And the request is still answered, after which the process exits by itself
    upload.sendall(body[5:])
    answer = upload.recv(65536)
    upload.close()
    assert answer.startswith(b"HTTP/1.1 202"), answer[:200]
    assert process.wait(timeout=10) == 0
    log = broker.log_path.read_text()
    assert "Draining on shutdown." in log and '"finished":true' in log


def test_a_replica_whose_redis_froze_exits_within_shutdown_grace(
    start_broker: BrokerFactory, simulator: SimulatorProcess, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # Given a replica driving a job on a Redis of its own
    server = RedisServer(tmp_path_factory.mktemp("frozen-redis"))
    server.start()
    assert server.process is not None
    try:
        broker = start_broker(redis_url=server.url, HERMES_URL=simulator.url, SHUTDOWN_GRACE="3000")
        status, body = broker.request("POST", "/v1/runs", {"input": "frozen redis sleep:30"})
        assert status == 202, body
        until(lambda: broker.request("GET", f"/v1/runs/{body['run_id']}")[1]["status"] == "running", 15)
        # When Redis freezes (SIGSTOP: its sockets stay open, nothing answers) and the replica is told to stop
        server.process.send_signal(signal.SIGSTOP)
        assert broker.process is not None
        process = broker.process
        began = time.monotonic()
        process.terminate()
        # Then it still exits, within SHUTDOWN_GRACE (and what a loaded machine adds to start and end a process),
        # saying what it left
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            pytest.fail("the replica hung on shutdown with Redis frozen")
        assert time.monotonic() - began < 8
        assert "The drain did not finish within SHUTDOWN_GRACE" in broker.log_path.read_text()
    finally:
        server.process.send_signal(signal.SIGCONT)
        server.stop()
