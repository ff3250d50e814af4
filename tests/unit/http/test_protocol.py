"""Which envelope a parse failure answers (broker/http/protocol.py), for both of aiohttp's request parsers."""

from __future__ import annotations

import asyncio

import pytest
from aiohttp.http_exceptions import BadHttpMessage, HttpProcessingError
from aiohttp.http_parser import HttpRequestParser, HttpRequestParserPy

from broker.http.protocol import answer

PARSERS = [pytest.param(HttpRequestParser, id="c-parser"), pytest.param(HttpRequestParserPy, id="python-parser")]
LIMIT = 8190


class _Protocol:
    """What a request parser needs of its protocol before any payload: nothing but an identity."""


def _parse_error(parser: type[HttpRequestParserPy], data: bytes) -> HttpProcessingError:
    async def parse() -> HttpProcessingError:
        feeder = parser(_Protocol(), asyncio.get_running_loop(), 2**16, max_line_size=LIMIT, max_field_size=LIMIT)  # type: ignore[arg-type]
        with pytest.raises(HttpProcessingError) as caught:
            feeder.feed_data(data)
        return caught.value

    return asyncio.run(parse())


@pytest.mark.parametrize("parser", PARSERS)
@pytest.mark.parametrize(
    ("data", "status", "code"),
    [
        (b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 414, "uri_too_long"),
        (b"POST http://broker/" + b"a" * 9000 + b" HTTP/1.1\r\n\r\n", 414, "uri_too_long"),
        (b"GET / HTTP/1.1\r\nReferer: /" + b"a" * 9000 + b"\r\n\r\n", 431, "header_too_large"),
        (b"GET / HTTP/1.1\r\nX-Url: GET /" + b"a" * 9000 + b"\r\n\r\n", 431, "header_too_large"),
        (b"GET / HTTP/1.1\r\nX" + b"a" * 9000 + b": 1\r\n\r\n", 431, "header_too_large"),
    ],
    ids=["path", "absolute-uri", "value-like-a-path", "value-like-a-request-line", "name"],
)
def test_a_line_over_the_limit_names_its_part_of_the_request(
    parser: type[HttpRequestParserPy], data: bytes, status: int, code: str
) -> None:
    error = _parse_error(parser, data)
    assert answer(400, error, max_headers=128)[:2] == (status, code)
    assert str(LIMIT) in answer(400, error, max_headers=128)[2]


def test_too_many_headers_answer_431_naming_the_count() -> None:
    assert answer(400, BadHttpMessage("Too many headers received"), max_headers=128) == (
        431,
        "header_too_large",
        "Request has more than 128 header fields",
    )


def test_other_parse_failures_stay_400_bad_request() -> None:
    assert answer(400, BadHttpMessage("Invalid method"), max_headers=128) == (
        400,
        "bad_request",
        "Malformed HTTP request: Bad Request",
    )
    assert answer(500, RuntimeError("boom"), max_headers=128)[:2] == (500, "internal_error")
