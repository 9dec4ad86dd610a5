"""A response's headers read without the ``email`` package, in the agent's process.

``http.client`` hands every response's header block to ``email.parser``, a general MIME
parser in pure Python that costs many times what splitting the lines does. The agent reads
two such answers for every job it runs (the backend's, and its share of a poll's), so under
load that parser is a large share of the agent's CPU.

``parse_headers`` gives what ``http.client.parse_headers`` gives (the same ``HTTPMessage``,
the same names and values in the same order, the same errors for a line too long or too many
headers). It splits the lines itself only when each is a plain ``name: value`` line; any other
block (a folded line, a line with no colon, a name outside RFC 5322's printable characters, a
bare CR) goes to ``email.parser`` as before, so its handling of the odd cases stays the
stdlib's. ``install()`` puts it in ``http.client`` for this process (``http.client`` looks
the function up each time it reads a response); the agent's own process is the only one that
calls it.
"""

from __future__ import annotations

import email.parser
import http.client
import re
from typing import BinaryIO

# http.client's own limits (its _MAXLINE and _MAXHEADERS), with its own errors
MAX_LINE = 65536
MAX_HEADERS = 100

_END = (b"\r\n", b"\n", b"")
# what email.feedparser takes for a header line: RFC 5322's printable characters but the
# colon, then a colon (an empty name, which the stdlib also takes, is left to it)
_PLAIN = re.compile(r"[\041-\071\073-\176]+:[^\r\n]*\r?\n?\Z")


def parse_headers(
    fp: BinaryIO, _class: type[http.client.HTTPMessage] = http.client.HTTPMessage
) -> http.client.HTTPMessage:
    """``http.client.parse_headers``, without ``email.parser`` for plain lines."""
    lines = []
    while True:
        line = fp.readline(MAX_LINE + 1)
        if len(line) > MAX_LINE:
            raise http.client.LineTooLong("header line")
        lines.append(line)
        if len(lines) > MAX_HEADERS:
            raise http.client.HTTPException(f"got more than {MAX_HEADERS} headers")
        if line in _END:
            break
    text = [raw.decode("iso-8859-1") for raw in lines[:-1]]
    if not all(_PLAIN.match(each) for each in text):
        return email.parser.Parser(_class=_class).parsestr("".join(text) + lines[-1].decode())
    message = _class()
    for each in text:
        name, _, value = each.partition(":")
        message.set_raw(name, value.lstrip(" \t").rstrip("\r\n"))  # as email's compat32
    message.set_payload("")
    return message


def install() -> None:
    """Read every response's headers in this process with ``parse_headers``."""
    http.client.parse_headers = parse_headers  # type: ignore[assignment]
