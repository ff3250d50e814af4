"""The `upstreams` row's three simulators (capped at 4, 6 and 10): the run's own and two it spawns; one of the
spawned ones can be SIGKILLed and started again on its port. Also their `/_sim/` figures and request logs."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import AsyncIterator

import aiohttp
import orjson

from benchlib.procs import Proc, Services, wait_http
from benchlib.scenarios.admission import SIM_STEP_S
from broker.store.embedded import free_port

CAPS = (4, 6, 10)
Request = dict[str, object]


class Fleet:
    """The simulators' URLs in CAPS order; the spawned ones' processes by index (the run's own, 0, has none)."""

    def __init__(self, services: Services) -> None:
        self.services = services
        self.urls = [services.sim_url]
        self.procs: dict[int, Proc] = {}

    @property
    def names(self) -> list[str]:
        """Each simulator's upstream name as the broker shows it (its URL without the scheme)."""
        return [url.split("://", 1)[1] for url in self.urls]

    async def spawn(self, cap: int, port: int | None = None) -> Proc:
        port = port or free_port()
        argv = [sys.executable, "-m", "broker.simulator", "--port", str(port), "--max-concurrent", str(cap)]
        proc = self.services.stack.spawn("simulator", argv)
        url = f"http://127.0.0.1:{port}"
        await wait_http(f"{url}/health", 20, "simulator", proc)
        async with aiohttp.ClientSession() as session:
            async with session.post(f"{url}/_sim/settings", json={"step_s": SIM_STEP_S}) as answer:
                answer.raise_for_status()
        proc.url = url
        return proc

    def kill(self, index: int) -> None:
        """SIGKILL the spawned simulator `index`: its runs, streams and request log are gone."""
        proc = self.procs.pop(index)
        proc.popen.kill()
        proc.popen.wait(timeout=10)
        self.services.stack.stop(proc)

    async def restart(self, index: int) -> None:
        """A new simulator process on the killed one's port, with its cap and step."""
        port = int(self.urls[index].rsplit(":", 1)[1])
        self.procs[index] = await self.spawn(CAPS[index], port)

    def close(self) -> None:
        for proc in self.procs.values():
            self.services.stack.stop(proc)
        self.procs.clear()


@contextlib.asynccontextmanager
async def simulators(services: Services) -> AsyncIterator[Fleet]:
    """The run's simulator (capped at 4, reset) and two more (6, 10) spawned for the round."""
    await services.reset(max_concurrent=CAPS[0])
    fleet = Fleet(services)
    try:
        for index, cap in enumerate(CAPS[1:], start=1):
            fleet.procs[index] = await fleet.spawn(cap)
            fleet.urls.append(fleet.procs[index].url)
        yield fleet
    finally:
        fleet.close()


async def stats(session: aiohttp.ClientSession, url: str) -> dict[str, object]:
    async with session.get(f"{url}/_sim/stats") as answer:
        found: dict[str, object] = await answer.json()
        return found


def count(stats_of: dict[str, object], status: str) -> int:
    answers = stats_of["creates"]
    assert isinstance(answers, dict)
    return int(answers.get(status, 0))


async def requests(session: aiohttp.ClientSession, url: str) -> list[Request]:
    """The simulator's log of /v1 requests (method, path, status, idempotency_key, run_id of a started run)."""
    async with session.get(f"{url}/_sim/requests") as answer:
        answer.raise_for_status()
        found: list[Request] = (await answer.json())["requests"]
        return found


async def job_events(session: aiohttp.ClientSession, base: str, job_id: str) -> list[dict[str, object]]:
    """The broker job's events from the start until its stream closes (the terminal event, then `: stream
    closed`): waits for a job that has not ended yet."""
    events: list[dict[str, object]] = []
    timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
    async with session.get(f"{base}/v1/runs/{job_id}/events", timeout=timeout) as answer:
        answer.raise_for_status()
        async for raw in answer.content:
            line = raw.decode().rstrip("\r\n")
            if line.startswith("data:"):
                events.append(orjson.loads(line[5:]))
            elif line == ": stream closed":
                break
    return events
