"""The merge of the partitions' lists of keys with most waiting jobs (broker/admission/top_keys.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.admission.fair import KeyLoad, top_keys
from broker.admission.top_keys import Listed, candidates, merged, to_look_up

#: partitions of (key -> waiting jobs there); a key's weight is fixed by its name
partitions = st.lists(st.dictionaries(st.sampled_from("abcdefghijklmnop"), st.integers(1, 9), max_size=12), max_size=6)


def _weight(key: str) -> float:
    return 1.0 + "abcdefghijklmnop".index(key) / 2


def _listed(counts: dict[str, int], most: int) -> Listed:
    """A partition's list as line_figures.lua gives it: all its keys when few, else its first `most` by count."""
    ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return Listed(tuple((k, n, _weight(k)) for k, n in ranked[:most]), complete=len(ranked) <= most)


@given(partitions, st.integers(1, 12))
def test_the_counts_shown_are_exact_sums_in_order(parts: list[dict[str, int]], most: int) -> None:
    lists = [_listed(counts, most) for counts in parts]
    chosen = candidates(lists)
    wanted = to_look_up(lists, chosen)
    looked_up = {p: {k: parts[p].get(k, 0) for k in names} for p, names in wanted.items()}
    shown = merged(lists, chosen, looked_up, most=5)
    totals = {k: sum(counts.get(k, 0) for counts in parts) for k in chosen}
    assert shown == [KeyLoad(k, n, _weight(k)) for k, n in sorted(totals.items(), key=lambda i: (-i[1], i[0]))[:5]]


@given(partitions)
def test_complete_lists_give_the_exact_top_keys(parts: list[dict[str, int]]) -> None:
    lists = [_listed(counts, 12) for counts in parts]  # every partition lists all its keys
    chosen = candidates(lists)
    assert to_look_up(lists, chosen) == {}
    entries = [(k, n, _weight(k)) for counts in parts for k, n in counts.items()]
    assert merged(lists, chosen, {}, most=10) == top_keys(entries, 10)
