"""Which replica drives a job (SPEC S3.2 `owner`): the job object, the listing and the console show the id of the
replica holding its run lease, null while none does; a lease of an earlier broker (a bare token) names none."""

from __future__ import annotations

from typing import Any

from redis.asyncio import Redis

from broker.http.appkeys import replica_key
from broker.store import keys
from broker.store.leases import new_token, owner_of
from tests.conftest import BOTH_BACKENDS
from tests.integration.conftest import ClientFactory
from tests.integration.driver.conftest import create, eventually, job, settled


async def test_a_driven_job_shows_its_replica_as_owner_and_none_once_finished(make_replica: ClientFactory) -> None:
    # Given a replica driving a job that takes a while
    replica = await make_replica()
    replica_id = replica.app[replica_key]  # type: ignore[index]
    created = await create(replica, {"input": "slow sleep:2"})
    job_id = created["run_id"]
    assert created["owner"] is None  # a new job: nobody drives it yet

    async def running() -> dict[str, Any] | None:
        current = await job(replica, job_id)
        return current if current["status"] == "running" else None

    # When it runs
    shown = await eventually(running)
    # Then the job object, the listing and the console name the replica
    assert shown["owner"] == replica_id
    listing = await (await replica.get("/v1/runs")).json()
    assert [entry["owner"] for entry in listing["data"] if entry["run_id"] == job_id] == [replica_id]
    page = await (await replica.get(f"/console/jobs/{job_id}")).text()
    assert f'<td data-field="owner">{replica_id}</td>' in page
    overview = await (await replica.get("/console")).text()
    assert f'<td data-field="owner">{replica_id}</td>' in overview
    # And once it finished nobody drives it
    assert (await settled(replica, job_id))["owner"] is None


async def test_a_job_whose_lease_an_earlier_broker_holds_shows_no_owner(
    make_client: ClientFactory, redis: Redis
) -> None:
    # Given a queued job whose run lease holds a bare token, as a replica of an earlier broker writes it
    client = await make_client()
    job_id = (await create(client, {"input": "x"}))["run_id"]
    await redis.set(keys.lease(job_id), new_token(), px=60_000)
    # Then it shows no owner; a lease of this broker's names its replica
    assert (await job(client, job_id))["owner"] is None
    await redis.set(keys.lease(job_id), new_token("host-1-77-abc123"), px=60_000)
    assert (await job(client, job_id))["owner"] == "host-1-77-abc123"


def test_a_token_names_its_replica() -> None:
    assert owner_of(new_token("h.example-9-0a1b2c")) == "h.example-9-0a1b2c"
    assert owner_of(new_token()) is None and owner_of(None) is None and owner_of("") is None


@BOTH_BACKENDS
async def test_an_odd_lease_value_shows_no_owner_or_what_it_names_and_never_a_500(
    make_client: ClientFactory, redis: Redis
) -> None:
    # Given a queued job whose run lease holds odd values: empty, a bare separator, very long, not UTF-8
    client = await make_client()
    job_id = (await create(client, {"input": "x"}))["run_id"]
    long_owner = "r" * 100_000
    for value, owner in ((b"", None), (b"/", None), (b"/abc", None), (f"{long_owner}/abc".encode(), long_owner)):
        await redis.set(keys.lease(job_id), value, px=60_000)
        # Then the job object, the listing and the console answer, the owner as the token names it (or none)
        assert (await job(client, job_id))["owner"] == owner
        listing = await client.get("/v1/runs")
        assert listing.status == 200
        assert [e["owner"] for e in (await listing.json())["data"] if e["run_id"] == job_id] == [owner]
        assert (await client.get(f"/console/jobs/{job_id}")).status == 200
        assert (await client.get("/console")).status == 200
    await redis.set(keys.lease(job_id), b"\xff\xfe/abc", px=60_000)
    for path in (f"/v1/runs/{job_id}", "/v1/runs", f"/console/jobs/{job_id}", "/console"):
        assert (await client.get(path)).status == 200, path
    assert (await job(client, job_id))["owner"] is not None  # what the token names, undecodable bytes replaced
