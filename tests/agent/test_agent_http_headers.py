"""The agent's header reader gives what http.client's gives, for any block of header lines,
and the agent's process reads real answers with it."""

from __future__ import annotations

import http.client
import http.server
import io
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent import http_headers
from tests.helpers import examples

NAMES = st.sampled_from(["content-length", "Content-Type", "date", "x-a", "X_B", "From", "a.b"])
ODD_NAMES = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=255), max_size=12)
VALUES = st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=255), max_size=40)
ENDS = st.sampled_from(["\r\n", "\n", "\r", "", " \r\n", "\t\n"])


def _line(name: str, separator: str, value: str, end: str) -> bytes:
    return (name + separator + value + end).encode("iso-8859-1")


LINES = st.one_of(
    st.builds(_line, NAMES, st.sampled_from([":", ": ", ":\t ", ":"]), VALUES, ENDS),
    st.builds(_line, ODD_NAMES, st.sampled_from([":", " ", ""]), VALUES, ENDS),
    st.builds(_line, st.sampled_from([" ", "\t", "From "]), st.just(""), VALUES, ENDS),
)
BLOCKS = st.builds(
    lambda lines, end, rest: b"".join(lines) + end + rest,
    st.lists(LINES, max_size=8),
    st.sampled_from([b"\r\n", b"\n", b""]),
    st.sampled_from([b"", b"body", b"x: y\r\n"]),
)


def _read(parse: Any, block: bytes) -> tuple[Any, ...]:
    fp = io.BytesIO(block)
    try:
        message = parse(fp)
    except http.client.HTTPException as exc:
        return ("raised", type(exc), str(exc), fp.tell())
    return (
        type(message), message.items(), message.get_payload(), [type(d) for d in message.defects],
        message.get_unixfrom(), message.preamble, message.epilogue, fp.tell(),
    )  # fmt: skip


@settings(max_examples=examples(600), deadline=None)
@given(BLOCKS)
def test_any_block_reads_as_http_client_reads_it(block: bytes) -> None:
    assert _read(http_headers.parse_headers, block) == _read(http.client.parse_headers, block)


def test_the_common_answer_takes_the_fast_path_and_the_odd_one_the_stdlibs() -> None:
    plain = b"date: Wed, 02 Dec 2026 06:00:00 GMT\r\ncontent-length: 2 \r\n\r\n{}"
    message = http_headers.parse_headers(io.BytesIO(plain))
    assert message.items() == [("date", "Wed, 02 Dec 2026 06:00:00 GMT"), ("content-length", "2 ")]
    assert message["Content-Length"] == "2 " and message.get_all("date") is not None
    folded = b"x-long: one\r\n two\r\n\r\n"
    assert http_headers.parse_headers(io.BytesIO(folded))["x-long"] == "one\r\n two"


@pytest.mark.parametrize(
    ("block", "error"),
    [
        (b"a: " + b"x" * http_headers.MAX_LINE + b"\r\n\r\n", http.client.LineTooLong),
        (b"a: b\r\n" * (http_headers.MAX_HEADERS + 1) + b"\r\n", http.client.HTTPException),
    ],
)
def test_the_limits_are_http_clients(block: bytes, error: type[Exception]) -> None:
    with pytest.raises(error) as ours:
        http_headers.parse_headers(io.BytesIO(block))
    with pytest.raises(error) as stdlib:
        http.client.parse_headers(io.BytesIO(block))
    assert str(ours.value) == str(stdlib.value)


@pytest.fixture
def installed() -> Iterator[None]:
    before = http.client.parse_headers
    http_headers.install()
    yield
    http.client.parse_headers = before


def test_installed_it_reads_a_real_servers_answers(installed: None) -> None:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("x-folded", "one")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        assert http.client.parse_headers is http_headers.parse_headers
        conn = http.client.HTTPConnection("127.0.0.1", server.server_address[1], timeout=5)
        for n in range(3):  # one keep-alive connection: each answer read to its end
            conn.request("POST", "/", body=b'{"n": %d}' % n)
            answer = conn.getresponse()
            assert answer.status == 200 and answer.getheader("X-Folded") == "one"
            assert answer.read() == b'{"n": %d}' % n
        conn.close()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
