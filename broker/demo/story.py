"""The demo's jobs: one that completes, one held while Hermes is busy, one interrupted by a Hermes
restart and resubmitted, one stopped and one denied. Each is watched and printed as it changes, and
checked against how it should end."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import aiohttp
import orjson
from attrs import define

TERMINAL = ("completed", "failed", "cancelled")
POLL_S = 0.25


@define
class Outcome:
    title: str
    expected: str
    problems: list[str]


class Story:
    def __init__(
        self, session: aiohttp.ClientSession, replicas: list[str], hermes: list[str], say: Callable[[str], None]
    ):
        """`hermes`: the simulators' URLs (SPEC S10: the replicas spread the jobs over them); every fault the story
        plays (busy, restart) is played on all of them."""
        self.session, self.replicas, self.hermes, self.say = session, replicas, hermes, say
        self.outcomes: list[Outcome] = []
        self._shown: dict[str, tuple[object, ...]] = {}  #: the last printed state of each job

    async def run(self) -> bool:
        """Play every scenario; True when every job ended as expected."""
        await self.held()
        await self.interrupted()
        await asyncio.gather(self.completes(), self.stopped(), self.denied())
        for outcome in self.outcomes:
            verdict = "as expected" if not outcome.problems else "NOT as expected: " + "; ".join(outcome.problems)
            self.say(f"result  {outcome.title}: {outcome.expected} — {verdict}")
        return all(not outcome.problems for outcome in self.outcomes)

    async def held(self) -> None:
        await self._sim("settings", {"busy": True})
        self.say("hermes  the simulators answer 429 busy to every create")
        job_id = await self._create(0, "Held while Hermes is busy", "tools:1")
        await self._until(job_id, lambda job: job["hold"] is not None)
        await asyncio.sleep(2)
        await self._sim("settings", {"busy": False})
        self.say("hermes  the simulators accept creates again")
        await self._expect(job_id, "Held while Hermes is busy", "completed after a hold", "completed", saw="job.held")

    async def interrupted(self) -> None:
        job_id = await self._create(1, "Interrupted by a Hermes restart", "sleep:4")
        await self._until(job_id, lambda job: job["status"] == "running")
        await asyncio.sleep(1)
        await self._sim("restart", {})
        self.say("hermes  the simulators restarted and forgot every run")
        title = "Interrupted by a Hermes restart"
        await self._expect(job_id, title, "completed on attempt 2", "completed", saw="job.resubmitted", attempts=2)

    async def completes(self) -> None:
        job_id = await self._create(0, "A job that completes", "tools:2 sleep:1")
        await self._expect(job_id, "A job that completes", "completed", "completed")

    async def stopped(self) -> None:
        job_id = await self._create(1, "Stopped by an operator", "sleep:30")
        await self._until(job_id, lambda job: job["status"] == "running")
        await self._post(0, f"/v1/runs/{job_id}/stop", None)
        self.say(f"stop    {job_id}")
        await self._expect(job_id, "Stopped by an operator", "cancelled (stopped)", "cancelled", error="stopped")

    async def denied(self) -> None:
        job_id = await self._create(0, "Approval denied", "approval")
        await self._until(job_id, lambda job: job["status"] == "waiting_for_approval")
        await self._post(1, f"/v1/runs/{job_id}/approval", {"choice": "deny"})
        self.say(f"deny    {job_id}")
        title = "Approval denied"
        await self._expect(job_id, title, "cancelled (approval_denied)", "cancelled", error="approval_denied")

    async def _create(self, replica: int, title: str, text: str) -> str:
        job = await self._post(replica, "/v1/runs", {"input": f"{title}. {text}", "context": {"title": title}})
        job_id = str(job["run_id"])
        self.say(f"create  {job_id}  {title!r} on replica {replica + 1}")
        return job_id

    async def _expect(
        self, job_id: str, title: str, expected: str, status: str, *, saw: str = "", attempts: int = 0, error: str = ""
    ) -> None:
        job = await self._until(job_id, lambda job: job["status"] in TERMINAL, timeout=40)
        problems = [] if job and job["status"] == status else [f"ended {job and job['status']}"]
        if job and error and (job["error"] or {}).get("code") != error:
            problems.append(f"error {job['error']}")
        if job and attempts and job["attempts"] != attempts:
            problems.append(f"{job['attempts']} attempts")
        if saw and saw not in await self._event_names(job_id):
            problems.append(f"no {saw} event")
        self.outcomes.append(Outcome(title, expected, problems))

    async def _until(
        self, job_id: str, done: Callable[[dict[str, Any]], bool], timeout: float = 30
    ) -> dict[str, Any] | None:
        """Poll the job (printing each change) until `done`; None at the deadline."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            async with self.session.get(f"{self.replicas[0]}/v1/runs/{job_id}") as answer:
                job: dict[str, Any] = await answer.json()
            state = (job["status"], job["last_event"], (job["hold"] or {}).get("reason"), job["attempts"])
            if state != self._shown.get(job_id):
                self._shown[job_id] = state
                hold = f"  hold={state[2]}" if state[2] else ""
                self.say(f"job     {job_id}  {state[0]:<20} last={state[1]}  attempts={state[3]}{hold}")
            if done(job):
                return job
            await asyncio.sleep(POLL_S)
        return None

    async def _event_names(self, job_id: str) -> list[str]:
        async with self.session.get(f"{self.replicas[1]}/v1/runs/{job_id}/events") as answer:
            text = await answer.text()
        return [orjson.loads(line[6:])["event"] for line in text.splitlines() if line.startswith("data: ")]

    async def _post(self, replica: int, path: str, body: Any) -> dict[str, Any]:
        data = orjson.dumps(body) if body is not None else b""
        headers = {"Content-Type": "application/json"}
        async with self.session.post(f"{self.replicas[replica]}{path}", data=data, headers=headers) as answer:
            result: dict[str, Any] = await answer.json()
            return result

    async def _sim(self, action: str, body: dict[str, Any]) -> None:
        for hermes in self.hermes:
            async with self.session.post(f"{hermes}/_sim/{action}", data=orjson.dumps(body)) as answer:
                answer.raise_for_status()
