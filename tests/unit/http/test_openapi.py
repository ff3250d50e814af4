"""The OpenAPI document (SPEC S3.8) is valid OpenAPI 3.1 and one truth with the code: the app's routes, the error
codes the code answers, and the route table of the API reference (docs/reference/api.md)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from openapi_spec_validator import validate

from broker import errors
from broker.app import create_app
from broker.config import Config
from broker.errors import ERROR_CODES, InvalidRequest
from broker.http.openapi import PROTOCOL_CODES, document
from broker.http.openapi_schemas import URL
from broker.http.schemas import parse_context

ROOT = Path(__file__).resolve().parents[3]
#: Where the broker answers errors (the simulator and the Hermes client speak Hermes's codes, not the broker's).
ANSWERING = ["broker/errors.py", "broker/http", "broker/jobs", "broker/console", "broker/admission"]
#: Codes the broker relays from Hermes without raising them itself.
RELAYED = {"approval_not_pending"}
#: Registered only so that every method answers 404 there (a route Hermes removed): not part of the API.
UNDOCUMENTED = {("*", "/v1/runs/reviews")}
#: Codes every route (or every route with a body, or that changes a job) may answer: the route table lists them above
#: its route table, not in each row.
SHARED = {*PROTOCOL_CODES, "not_found", "cross_site_request", "body_too_large", "bad_gateway", "unavailable", "busy"}
METHODS = ("get", "post", "put", "patch", "delete")


def test_the_document_is_valid_openapi_3_1() -> None:
    validate(document())  # type: ignore[arg-type]
    assert document()["openapi"].startswith("3.1")


def test_every_route_of_the_app_is_documented_and_every_documented_route_is_served() -> None:
    app = create_app(Config(redis_url="redis://127.0.0.1:1/0"), drive=False)
    served = {
        (route.method, _template(route.resource.canonical))
        for route in app.router.routes()
        if route.resource is not None and route.method != "HEAD"  # aiohttp adds HEAD to every GET
    } - UNDOCUMENTED
    documented = {(method.upper(), _template(path)) for path, item in document()["paths"].items() for method in item}
    assert served == documented


def test_every_error_code_the_code_answers_is_documented() -> None:
    answered = set().union(*(_codes_in(path) for folder in ANSWERING for path in _modules(folder)))
    assert answered, "found no error codes: the scan is broken"
    assert answered - ERROR_CODES.keys() == set()
    assert ERROR_CODES.keys() - answered - RELAYED == set(), "documented codes that nothing answers"


def test_every_error_class_answers_its_code_with_the_documented_status() -> None:
    classes = [errors.BrokerError, *_subclasses(errors.BrokerError)]
    coded = {cls: cls.code for cls in classes if cls.code is not None and cls.code != errors.BrokerError.code}
    assert coded, "found no error classes with a code"
    for cls, code in coded.items():
        assert ERROR_CODES[code][0] == cls.status, cls.__name__
    raised = {code for path in _modules("broker") for code in _raised(path, "InvalidRequest")}
    assert {ERROR_CODES[code][0] for code in raised} == {errors.InvalidRequest.status}
    raised = {code for path in _modules("broker") for code in _raised(path, "Conflict")}
    assert {ERROR_CODES[code][0] for code in raised} == {errors.Conflict.status}


def test_every_documented_code_is_answered_by_some_operation_with_its_status() -> None:
    named = set()
    for item in document()["paths"].values():
        for operation in item.values():
            for status, answer in operation["responses"].items():
                for code in _enum(answer):
                    assert ERROR_CODES[code][0] == int(status), code
                    named.add(code)
    # the rest are answered by no operation of its own: unknown paths, wrong methods, the last guard
    assert ERROR_CODES.keys() - named == {"method_not_allowed", "internal_error", "unsupported_media_type"}


def test_the_route_table_names_the_documented_routes_and_their_codes() -> None:
    rows = _table_routes()
    documented = {
        (method.upper(), _template(path)): operation
        for path, item in document()["paths"].items()
        for method, operation in item.items()
    }
    assert {route for routes, _ in rows for route in routes} == set(documented)
    for routes, answer in rows:
        listed = set(re.findall(r"(\d{3}) `([a-z_]+)`", answer)) | _listed_after_status(answer)
        for route in routes:
            codes = {(status, code) for status, a in documented[route]["responses"].items() for code in _enum(a)}
            assert listed - codes == set(), f"{route}: the route table names codes the document does not"
            # what a caller of this route must handle; the codes every route shares are listed above the table
            own = {(status, code) for status, code in codes if code not in SHARED}
            assert own - listed == set(), f"{route}: the route table leaves out codes the document lists"


def _template(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "{}", path)


def _enum(answer: dict[str, object]) -> list[str]:
    schema = answer.get("content", {}).get("application/json", {}).get("schema", {})  # type: ignore[attr-defined]
    for part in schema.get("allOf", []):
        enum = part.get("properties", {}).get("error", {}).get("properties", {}).get("code", {}).get("enum")
        if enum:
            return list(enum)
    return []


def _modules(folder: str) -> list[Path]:
    path = ROOT / folder
    return [path] if path.is_file() else sorted(path.rglob("*.py"))


def _codes_in(path: Path) -> set[str]:
    """Error codes a module answers: `code = "..."` on an error class, the code of `InvalidRequest(...)` and
    `Conflict(...)`, any `code="..."` argument, the values of `_HTTP_CODES`, and the `(status, code, ...)` tuples
    the protocol answers return."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ClassDef):
            found.update(_class_code(node))
        elif isinstance(node, ast.Call):
            found.update(_call_code(node))
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_HTTP_CODES" for t in node.targets):
            found.update(_strings(*node.value.values) if isinstance(node.value, ast.Dict) else set())
        elif isinstance(node, ast.Return) and isinstance(node.value, ast.Tuple) and len(node.value.elts) == 3:
            status, code, _ = node.value.elts
            if isinstance(status, ast.Constant) and isinstance(status.value, int):
                found.update(_strings(code))
    return found


def _class_code(node: ast.ClassDef) -> set[str]:
    found: set[str] = set()
    for statement in node.body:
        if isinstance(statement, ast.Assign) and any(getattr(t, "id", "") == "code" for t in statement.targets):
            found.update(_strings(statement.value))
        elif isinstance(statement, ast.AnnAssign) and getattr(statement.target, "id", "") == "code":
            found.update(_strings(statement.value))
    return found


def _call_code(node: ast.Call) -> set[str]:
    name = node.func.id if isinstance(node.func, ast.Name) else getattr(node.func, "attr", "")
    found = _strings(node.args[0]) if name in ("InvalidRequest", "Conflict") and node.args else set()
    return found | {code for k in node.keywords if k.arg == "code" for code in _strings(k.value)}


def _subclasses(cls: type[errors.BrokerError]) -> list[type[errors.BrokerError]]:
    return [sub for direct in cls.__subclasses__() for sub in (direct, *_subclasses(direct))]


def _raised(path: Path, name: str) -> set[str]:
    """The codes of the `name(...)` calls of a module (InvalidRequest and Conflict take theirs first)."""
    calls = (node for node in ast.walk(ast.parse(path.read_text())) if isinstance(node, ast.Call) and node.args)
    return {code for call in calls if getattr(call.func, "id", "") == name for code in _strings(call.args[0])}


def _strings(*nodes: ast.expr | None) -> set[str]:
    return {n.value for n in nodes if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _table_routes() -> list[tuple[list[tuple[str, str]], str]]:
    """The rows of the API reference's route table (docs/reference/api.md): the routes of the first cell, the text of
    the second."""
    text = (ROOT / "docs" / "reference" / "api.md").read_text()
    section = text.split("\n## ", 1)[0]  # the table comes before the page's first section
    rows = []
    for line in section.splitlines():
        if not line.startswith("| `"):
            continue
        first, answer = line[2:].split(" | ", 1)
        routes, method = [], ""
        for cell in re.findall(r"`([^`]+)`", first):
            parts = cell.split(" ", 1)
            if len(parts) == 2:
                method, path = parts
            else:
                path = parts[0]
            routes.append((method, _template(path)))
        rows.append((routes, answer))
    assert rows, "no route table under ## Routes"
    return rows


def _listed_after_status(answer: str) -> set[tuple[str, str]]:
    """`400 `a`, `b`, `c`` lists: each code after a status, up to the next text that is not a code."""
    listed = set()
    for status, codes in re.findall(r"(\d{3}) ((?:`[a-z_]+`(?:, )?)+)", answer):
        listed.update((status, code) for code in re.findall(r"`([a-z_]+)`", codes))
    return listed


URL_LIKE = st.text(alphabet="hHtTpPsS:/.@#?[]%-_*aZ09 \t\n\x00\x7f\u00aa\u3000\uff0f", max_size=12)


@settings(max_examples=2_000)
@given(st.sampled_from(["http://", "https://", "HTTP://", " http://", ""]).flatmap(lambda s: URL_LIKE.map(s.__add__)))
def test_every_url_a_create_takes_matches_the_documents_url_pattern(url: str) -> None:
    try:
        parse_context({"title": "t", "url": url})
    except InvalidRequest:
        return
    assert re.search(URL["pattern"], url), url


@pytest.mark.parametrize("url", [" http://h/", "http://h\t/", "ht\ntp://h/", "http://h/a b", "http://h/\x7f"])
def test_urls_with_spaces_or_control_characters_are_refused(url: str) -> None:
    with pytest.raises(InvalidRequest) as refused:
        parse_context({"title": "t", "url": url})
    assert refused.value.code == "invalid_context"
