"""`scheduling.multitask` and `session_history` on create (SPEC S4.3): the values taken, the conflicts refused."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from broker.errors import InvalidRequest
from broker.http.schemas import parse_create


def parse(**fields: Any) -> Any:
    return parse_create(orjson.dumps({"input": "hi", **fields}), {}, max_body=1 << 20)


@pytest.mark.parametrize("multitask", ["enqueue", "reject", "interrupt", "parallel"])
def test_each_multitask_strategy_is_taken(multitask: str) -> None:
    assert parse(session_id="s", scheduling={"multitask": multitask}).scheduling.multitask == multitask


@pytest.mark.parametrize("value", ["queue", "", "ENQUEUE", None, 1, ["enqueue"], {"x": 1}])
def test_any_other_multitask_is_invalid_scheduling_naming_the_field(value: object) -> None:
    with pytest.raises(InvalidRequest) as raised:
        parse(session_id="s", scheduling={"multitask": value})
    assert raised.value.code == "invalid_scheduling" and raised.value.param == "scheduling.multitask"


def test_multitask_is_not_given_when_absent() -> None:
    assert parse(session_id="s").scheduling.multitask is None


@pytest.mark.parametrize("value", [True, False])
def test_session_history_is_a_boolean(value: bool) -> None:
    assert parse(session_id="s", session_history=value).session_history is value
    assert parse(session_id="s").session_history is None


@pytest.mark.parametrize("value", ["true", 1, 0, [], {}])
def test_a_session_history_that_is_no_boolean_is_invalid_field(value: object) -> None:
    with pytest.raises(InvalidRequest) as raised:
        parse(session_id="s", session_history=value)
    assert raised.value.code == "invalid_field" and raised.value.param == "session_history"


@pytest.mark.parametrize(
    ("fields", "conflict"),
    [
        ({}, "session_id"),
        ({"session_id": "s", "scheduling": {"multitask": "parallel"}}, "enqueue"),
        ({"session_id": "s", "scheduling": {"multitask": "reject"}}, "enqueue"),
        ({"session_id": "s", "conversation_history": [{"role": "user", "content": "x"}]}, "conversation_history"),
        ({"session_id": "s", "previous_response_id": "resp_1"}, "previous_response_id"),
    ],
)
def test_session_history_conflicts_are_invalid_field_naming_the_conflict(fields: dict[str, Any], conflict: str) -> None:
    with pytest.raises(InvalidRequest) as raised:
        parse(session_history=True, **fields)
    assert raised.value.code == "invalid_field" and conflict in raised.value.message


def test_session_history_false_has_no_conflicts() -> None:
    assert parse(session_history=False, previous_response_id="resp_1").session_history is False


def test_broker_only_fields_are_not_forwarded() -> None:
    command = parse(session_id="s", session_history=True, scheduling={"multitask": "enqueue"})
    assert set(orjson.loads(command.body)) == {"input", "session_id"}
