"""GET /v1/runs (SPEC S3.9): newest change first, status filter, cursor paging without repeats while jobs
change, 400 for bad parameters, expiry with the job, and the index rebuilt from the streams."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient
from redis.asyncio import Redis

from broker.ids import job_id_for_key
from broker.store import keys
from broker.store.keys import partition_of
from tests.conftest import BOTH_BACKENDS
from tests.integration.conftest import ClientFactory

pytestmark = BOTH_BACKENDS

SCRIPT = Path(__file__).resolve().parents[3] / "scripts" / "rebuild_projections.py"
JSON = {"Content-Type": "application/json"}


async def _create(client: TestClient[Any, Any], text: str = "hello", **body: Any) -> str:
    answer = await client.post("/v1/runs", data=orjson.dumps({"input": text, **body}), headers=JSON)
    assert answer.status == 202, await answer.text()
    run_id: str = (await answer.json())["run_id"]
    return run_id


async def _stop(client: TestClient[Any, Any], job_id: str) -> None:
    answer = await client.post(f"/v1/runs/{job_id}/stop")
    assert answer.status == 200 and (await answer.json())["status"] == "cancelled"


async def _list(client: TestClient[Any, Any], **query: str) -> dict[str, Any]:
    answer = await client.get("/v1/runs", params=query)
    assert answer.status == 200, await answer.text()
    body: dict[str, Any] = await answer.json()
    assert body["object"] == "list" and set(body) == {"object", "data", "next_cursor"}
    return body


async def _all_pages(client: TestClient[Any, Any], between: Any = None, **query: str) -> list[dict[str, Any]]:
    seen: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        page = await _list(client, **query, **({"cursor": cursor} if cursor else {}))
        seen.extend(page["data"])
        cursor = page["next_cursor"]
        if cursor is None:
            return seen
        if between is not None:
            await between(seen)


async def test_an_empty_store_lists_nothing(client: TestClient[Any, Any]) -> None:
    assert await _list(client) == {"object": "list", "data": [], "next_cursor": None}


async def test_jobs_are_listed_newest_change_first_as_their_job_objects(client: TestClient[Any, Any]) -> None:
    first, second, third = [await _create(client, text) for text in ("one", "two", "three")]
    await asyncio.sleep(0.005)
    await _stop(client, first)  # the oldest job changes last: it moves to the front
    listed = (await _list(client))["data"]
    assert listed[0]["run_id"] == first
    assert {job["run_id"] for job in listed[1:]} == {second, third}
    order = [(job["updated_at"], job["run_id"]) for job in listed]  # ties (one ms) by id
    assert order == sorted(order, reverse=True)
    for job in listed:  # each entry is exactly what GET /v1/runs/{id} answers
        assert job == await (await client.get(f"/v1/runs/{job['run_id']}")).json()
        assert "input" not in job and "instructions" not in job


async def test_paging_while_jobs_change_shows_no_job_twice(client: TestClient[Any, Any]) -> None:
    # Given more jobs than fit on a page (created fast: many share a millisecond)
    jobs = [await _create(client, f"job {n}") for n in range(27)]
    changed: set[str] = set()

    async def change_some(seen: list[dict[str, Any]]) -> None:
        # Between pages: stop one job already shown and one not shown yet (both move to the front)
        shown = {job["run_id"] for job in seen}
        unseen = [job for job in jobs if job not in shown and job not in changed]
        for job_id in [seen[0]["run_id"], *unseen[-1:]]:
            if job_id not in changed:
                changed.add(job_id)
                await asyncio.sleep(0.002)  # a later millisecond than every create: the change sorts first
                await _stop(client, job_id)

    # When the listing is paged 5 at a time
    listed = await _all_pages(client, change_some, limit="5")
    ids = [job["run_id"] for job in listed]
    # Then no job appears twice, and every job that did not change during the listing appears
    assert len(ids) == len(set(ids))
    assert set(jobs) - changed <= set(ids)
    # And the whole listing is ordered by latest change, newest first (ties by id)
    unchanged = [job for job in listed if job["run_id"] not in changed]
    order = [(job["updated_at"], job["run_id"]) for job in unchanged]
    assert order == sorted(order, reverse=True)
    # And a listing after the changes has every job once, the changed ones first
    final = [job["run_id"] for job in await _all_pages(client, limit="7")]
    assert sorted(final) == sorted(jobs)
    assert set(final[: len(changed)]) == changed


async def test_the_status_filter_selects_any_of_the_given_statuses(client: TestClient[Any, Any]) -> None:
    queued = [await _create(client, f"q {n}") for n in range(3)]
    stopped = [await _create(client, f"s {n}") for n in range(4)]
    for job_id in stopped:
        await _stop(client, job_id)
    by_status = {
        "queued": set(queued),
        "cancelled": set(stopped),
        "queued,cancelled": set(queued + stopped),
        "running,completed": set(),
        " cancelled ,cancelled": set(stopped),
    }
    for status, expected in by_status.items():
        listed = await _all_pages(client, status=status, limit="2")
        assert [job["run_id"] for job in listed if job["run_id"] in expected] == [job["run_id"] for job in listed]
        assert {job["run_id"] for job in listed} == expected, status
        assert all(job["status"] in status for job in listed)


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ({"limit": "0"}, "limit"),
        ({"limit": "201"}, "limit"),
        ({"limit": "-1"}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"limit": ""}, "limit"),
        ({"limit": "٣"}, "limit"),
        ({"status": "done"}, "status"),
        ({"status": ""}, "status"),
        ({"status": "queued,"}, "status"),
        ({"status": "interrupted"}, "status"),
        ({"cursor": "not a cursor"}, "cursor"),
        ({"cursor": ""}, "cursor"),
        ({"cursor": base64.urlsafe_b64encode(b"12:run_x").decode()}, "cursor"),
        ({"cursor": base64.urlsafe_b64encode(b"\xff\xfe").decode()}, "cursor"),
    ],
)
async def test_a_bad_parameter_answers_400_naming_it(
    client: TestClient[Any, Any], query: dict[str, str], param: str
) -> None:
    answer = await client.get("/v1/runs", params=query)
    assert answer.status == 400
    error = (await answer.json())["error"]
    assert (error["code"], error["param"], error["type"]) == ("invalid_field", param, "invalid_request_error")
    assert param in error["message"]


async def test_jobs_leave_the_listing_when_they_expire(make_client: ClientFactory, redis: Redis) -> None:
    # Given a broker that keeps jobs one second after they ended, and a job that ended (a stop of a queued job)
    client = await make_client(runs_retention_ms=1000)
    old = await _create(client, "old")
    assert (await client.post(f"/v1/runs/{old}/stop")).status == 200
    assert [job["run_id"] for job in (await _list(client))["data"]] == [old]
    # When the job expires
    deadline = time.monotonic() + 10
    while await redis.exists(keys.view(old)) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    assert (await client.get(f"/v1/runs/{old}")).status == 404
    # Then it is not listed, and the next job of its partition that ends the same way trims it from the indexes
    assert (await _list(client))["data"] == []
    key = next(k for k in (f"fresh-{n}" for n in range(10_000)) if partition_of(job_id_for_key(k)) == partition_of(old))
    answer = await client.post(
        "/v1/runs", data=orjson.dumps({"input": "fresh"}), headers={**JSON, "Idempotency-Key": key}
    )
    fresh = (await answer.json())["run_id"]
    assert [job["run_id"] for job in (await _list(client))["data"]] == [fresh]
    assert await redis.zscore(keys.runs(keys.partition_of(old)), old) is not None  # a create trims nothing
    assert (await client.post(f"/v1/runs/{fresh}/stop")).status == 200
    assert await redis.zscore(keys.runs(keys.partition_of(old)), old) is None
    assert await redis.zscore(keys.runs_index(keys.partition_of(old), "cancelled"), old) is None
    assert [job["run_id"] for job in (await _list(client))["data"]] == [fresh]


async def test_an_index_entry_of_a_vanished_job_is_skipped(client: TestClient[Any, Any], redis: Redis) -> None:
    jobs = [await _create(client, f"j {n}") for n in range(4)]
    await redis.delete(keys.view(jobs[1]), keys.events(jobs[1]))
    listed = await _all_pages(client, limit="1")
    assert sorted(job["run_id"] for job in listed) == sorted([jobs[3], jobs[2], jobs[0]])


async def _rebuild(redis_target: tuple[str, bool], *args: str) -> tuple[int, list[dict[str, Any]]]:
    url, cluster = redis_target
    env = {**os.environ, "REDIS_URL": url, "REDIS_CLUSTER": str(cluster).lower(), "PYTHONPATH": str(SCRIPT.parents[1])}
    done = await asyncio.to_thread(
        subprocess.run, [sys.executable, str(SCRIPT), *args], env=env, capture_output=True, timeout=60, check=False
    )
    return done.returncode, [orjson.loads(line) for line in done.stdout.splitlines() if line.strip()]


async def test_the_rebuild_restores_the_index_from_the_streams(
    client: TestClient[Any, Any], redis: Redis, redis_target: tuple[str, bool]
) -> None:
    # Given listed jobs in two statuses
    jobs = [await _create(client, f"r {n}") for n in range(3)]
    await _stop(client, jobs[0])
    before = await _all_pages(client)
    assert (await _rebuild(redis_target))[1][-1]["differing"] == 0
    # When the index is lost, and a stale entry is left for a job that is gone
    for job_id in jobs:
        partition = keys.partition_of(job_id)
        for key in (keys.runs(partition), *(keys.runs_index(partition, s) for s in ("queued", "cancelled"))):
            await redis.delete(key)
    await redis.zadd(keys.runs_index(keys.partition_of("job_gone"), "running"), {"job_gone": 1})
    assert (await _list(client))["data"] == []
    # Then a dry run reports each entry and changes nothing
    code, lines = await _rebuild(redis_target)
    assert code == 1 and lines[-1]["differing"] == 4
    assert {line["job"] for line in lines[:-1]} == {*jobs, "job_gone"}
    assert (await _list(client))["data"] == []
    # And --write rebuilds it: the listing is the same again, and a later change keeps it right
    code, lines = await _rebuild(redis_target, "--write")
    assert code == 0
    assert await _all_pages(client) == before
    assert await redis.zscore(keys.runs_index(keys.partition_of("job_gone"), "running"), "job_gone") is None
    await _stop(client, jobs[1])
    assert {job["run_id"] for job in await _all_pages(client, status="queued")} == {jobs[2]}
    assert (await _rebuild(redis_target))[1][-1]["differing"] == 0


async def test_a_job_stored_before_the_index_is_indexed_under_its_status_on_its_next_write(
    client: TestClient[Any, Any], redis: Redis
) -> None:
    # Given a job as an older broker left it: no index entries (and a stale entry in another status index)
    job_id = await _create(client, "legacy")
    partition = keys.partition_of(job_id)
    await redis.zrem(keys.runs(partition), job_id)
    await redis.zrem(keys.runs_index(partition, "queued"), job_id)
    await redis.zadd(keys.runs_index(partition, "running"), {job_id: 1})
    assert (await _list(client))["data"] == []
    # When it changes
    await _stop(client, job_id)
    # Then it is listed once, under its status only (a stale entry elsewhere is never shown: the reader checks
    # each job's status, and writes move an entry only from the index of the status the job had)
    assert [job["run_id"] for job in (await _list(client))["data"]] == [job_id]
    for status in ("queued", "running", "cancelled"):
        listed = [job["run_id"] for job in (await _list(client, status=status))["data"]]
        assert listed == ([job_id] if status == "cancelled" else [])
