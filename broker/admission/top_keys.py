"""The fairness keys with most waiting jobs over the partitions (SPEC S4.2 `/readyz` `top_keys`). Pure; no IO.

A key's waiting jobs spread over every partition (a job's partition follows its id), so its count is a sum. Each
partition lists its own first keys (line_figures.lua: every key when it holds few, else the first LISTED of its
top zset), and the merge is two reads whatever the number of keys:
  1. the lists give each key a partial sum; the `CANDIDATES` keys of largest partial sum are the candidates;
  2. each candidate's count is read in every partition whose list is not complete and does not name it, so the
     counts shown are exact sums, and they are ordered by them.
A key left out of every list it could be in is not a candidate: in each partition more than LISTED keys have as
many waiting jobs as it has there. So a key with two or more jobs in some partition is found while fewer than
LISTED keys of that partition have as many; a key whose jobs sit one per partition ties with the one-job keys
there and may be missed (its count is at most PARTITIONS). The counts shown are always exact.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from attrs import frozen

from broker.admission.fair import TOP_KEYS, KeyLoad, top_keys

#: Keys each partition lists at most: a key with several waiting jobs in a partition is among its first keys
#: there (its count beats the one-job keys') unless more than LISTED keys have as many.
LISTED = 32
#: Keys whose exact counts the second read looks up: twice those shown, for the partial sums' misses.
CANDIDATES = 2 * TOP_KEYS


@frozen
class Listed:
    """One partition's keys as its read listed them: (key, waiting jobs, weight); `complete`: every key it has."""

    keys: tuple[tuple[str, int, float], ...]
    complete: bool


def candidates(lists: Iterable[Listed], most: int = CANDIDATES) -> list[str]:
    """The keys of largest partial sum over the lists (ties by name)."""
    sums: dict[str, int] = {}
    for listed in lists:
        for key, count, _ in listed.keys:
            sums[key] = sums.get(key, 0) + count
    return [key for key, _ in sorted(sums.items(), key=lambda item: (-item[1], item[0]))[:most]]


def to_look_up(lists: Sequence[Listed], keys: Sequence[str]) -> dict[int, list[str]]:
    """Per partition (its index in `lists`), the candidates whose count there is unknown: the list is not
    complete and does not name them."""
    wanted: dict[int, list[str]] = {}
    for partition, listed in enumerate(lists):
        if listed.complete:
            continue
        named = {key for key, _, _ in listed.keys}
        missing = [key for key in keys if key not in named]
        if missing:
            wanted[partition] = missing
    return wanted


def merged(
    lists: Sequence[Listed], keys: Sequence[str], looked_up: Mapping[int, Mapping[str, int]], most: int = TOP_KEYS
) -> list[KeyLoad]:
    """The first `most` of the candidates by their exact sums (the lists' counts and the looked-up ones)."""
    chosen = set(keys)
    entries = [entry for listed in lists for entry in listed.keys if entry[0] in chosen]
    weights = {key: weight for key, _, weight in entries}
    entries += [
        (key, count, weights.get(key, 1.0)) for counts in looked_up.values() for key, count in counts.items() if count
    ]
    return top_keys(entries, most)
