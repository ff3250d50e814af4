"""SIGTERM drain (SPEC S3.8, S4): not ready at once, /readyz keeps answering 503 while in-flight requests
finish, they are answered, and the process exits within SHUTDOWN_GRACE."""

from __future__ import annotations

import socket
import time

from tests.conftest import RedisServer
from tests.e2e.conftest import BrokerFactory


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
