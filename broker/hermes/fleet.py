"""The Hermes deployments and one client each (SPEC S10), in `HERMES_URL` order; built by the composition root."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

from broker.hermes.client import AiohttpHermesClient, HermesClient, Observer
from broker.upstreams import Upstream

#: The client of an upstream by name (the first's for None): what talks to an attempt's upstream needs (SPEC S10).
ClientOf = Callable[[str | None], HermesClient]


class Fleet:
    """Every upstream with its own client (its own key); the first is the one a one-URL broker always had."""

    def __init__(self, members: Sequence[tuple[Upstream, HermesClient]]) -> None:
        if not members:
            raise ValueError("a fleet needs at least one upstream")
        self._members = tuple(members)
        self._by_name = {upstream.name: client for upstream, client in self._members}

    @classmethod
    def build(
        cls,
        upstreams: Sequence[Upstream],
        timeout_ms: int,
        observe: Observer | None = None,
        first: HermesClient | None = None,
    ) -> Fleet:
        """One `AiohttpHermesClient` per upstream; `first` (a test's client) stands in for the first one's."""
        members: list[tuple[Upstream, HermesClient]] = []
        for upstream in upstreams:
            client: HermesClient
            if upstream.index == 0 and first is not None:
                client = first
            else:
                client = AiohttpHermesClient(upstream.url, upstream.api_key, timeout_ms, observe=observe)
            members.append((upstream, client))
        return cls(members)

    @property
    def first(self) -> HermesClient:
        return self._members[0][1]

    @property
    def upstreams(self) -> tuple[Upstream, ...]:
        return tuple(upstream for upstream, _ in self._members)

    def client(self, name: str) -> HermesClient:
        """The client of the upstream named `name`; KeyError for a name this broker does not know."""
        return self._by_name[name]

    def client_or_first(self, name: str | None) -> HermesClient:
        """The client of `name`; the first's for None (a run accepted before SPEC S10) or a name no longer listed."""
        return self._by_name.get(name or "", self.first)

    def __iter__(self) -> Iterator[tuple[Upstream, HermesClient]]:
        return iter(self._members)

    def __len__(self) -> int:
        return len(self._members)

    async def aclose(self) -> None:
        for _, client in self._members:
            await client.aclose()
