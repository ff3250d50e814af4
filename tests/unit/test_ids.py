"""Pure id helpers: job ids, upstream idempotency keys, execution fingerprints."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from broker.ids import fingerprint, is_job_id, job_id_for_key, new_job_id, thread_key, upstream_key

keys = st.text(alphabet=st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=255)
inputs = st.text() | st.lists(st.fixed_dictionaries({"role": st.text(), "content": st.text()}), max_size=3)


@given(keys)
def test_job_id_for_key_is_deterministic_and_a_job_id(key: str) -> None:
    assert job_id_for_key(key) == job_id_for_key(key)
    assert is_job_id(job_id_for_key(key))


@given(keys, keys)
def test_different_keys_claim_different_jobs(a: str, b: str) -> None:
    assert (job_id_for_key(a) == job_id_for_key(b)) == (a == b)


def test_new_job_ids_are_job_ids_and_unique() -> None:
    ids = {new_job_id() for _ in range(1000)}
    assert len(ids) == 1000
    assert all(is_job_id(job_id) for job_id in ids)


def test_is_job_id_rejects_other_shapes() -> None:
    assert not is_job_id("run_0123456789abcdef0123456789abcdef")
    assert not is_job_id("job_0123")
    assert not is_job_id("job_0123456789ABCDEF0123456789ABCDEF")
    assert not is_job_id("reviews")


@given(st.integers(min_value=2, max_value=1000))
def test_upstream_key_is_the_job_id_then_hash_attempt(attempt: int) -> None:
    job_id = new_job_id()
    assert upstream_key(job_id, 1) == job_id
    assert upstream_key(job_id, attempt) == f"{job_id}#{attempt}"


def test_thread_key() -> None:
    assert thread_key("job_1") == "runs-job_1"


@given(inputs, st.none() | st.text())
def test_fingerprint_is_deterministic(input_value: object, instructions: str | None) -> None:
    assert fingerprint(input_value, instructions) == fingerprint(input_value, instructions)
    assert len(fingerprint(input_value, instructions)) == 64


@given(inputs, st.none() | st.text(), inputs, st.none() | st.text())
def test_fingerprint_depends_on_input_and_instructions(a: object, ai: str | None, b: object, bi: str | None) -> None:
    assert (fingerprint(a, ai) == fingerprint(b, bi)) == (a == b and ai == bi)


def test_fingerprint_ignores_key_order_of_messages() -> None:
    assert fingerprint([{"role": "user", "content": "x"}], None) == fingerprint(
        [{"content": "x", "role": "user"}], None
    )


def test_fingerprint_tells_a_string_from_a_message() -> None:
    assert fingerprint("hi", None) != fingerprint([{"role": "user", "content": "hi"}], None)
    assert fingerprint("hi", None) != fingerprint("hi", "")
