"""A pool machine's user-data: built as data, dumped as ``#cloud-config``.

It writes the agent's settings (controller URL, machine name, one-time join token: the only
secret in it, never the backend's env; the machine credential of its first join is written
by the agent beside it, never here), installs the agent, pinned by sha256 and embedded
compressed (its code without comments or docstrings), with ``cloud-init/install-agent.sh``,
and runs it as the systemd service of ``cloud-init/sp00ky-agent.service``. Hetzner takes at
most 32 KiB of user-data.
"""

from __future__ import annotations

import ast
import base64
import functools
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import yaml

from sp00ky_infra.shared.errors import SharedError

ROOT = Path(__file__).resolve().parent.parent.parent
CLOUD_INIT = ROOT / "cloud-init"
AGENT = ROOT / "agent"
USER_DATA_LIMIT = 32 * 1024  # Hetzner Cloud's limit on user-data


class UserDataTooLarge(SharedError, ValueError):
    """The user-data is over Hetzner's limit; the message gives its size and the limit."""


def shipped_source(source: bytes, name: str) -> bytes:
    """A module as it ships in user-data: the same code without its comments and docstrings
    (the agent's sources with them, compressed, do not fit in Hetzner's 32 KiB; stripped,
    they take about two thirds as much). The stripped module must parse to the same code, or this
    refuses to ship it."""
    tree = ast.parse(source, name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = node.body[1:] or [ast.Pass()]
    shipped = ast.unparse(tree) + "\n"
    if ast.dump(ast.parse(shipped, name)) != ast.dump(tree):
        raise SharedError(f"{name}: the agent's module does not survive stripping unchanged")
    return shipped.encode()


@functools.cache
def agent_archive() -> bytes:
    """The agent's sources as a reproducible tar.gz (sorted, no times or owners), comments and
    docstrings left out (``shipped_source``)."""
    buffer = io.BytesIO()
    with tarfile.open(
        fileobj=buffer, mode="w:gz", compresslevel=9, format=tarfile.PAX_FORMAT
    ) as tar:
        for path in sorted(AGENT.glob("*.py")):
            info = tarfile.TarInfo(f"agent/{path.name}")
            data = shipped_source(path.read_bytes(), path.name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    # gzip stamps the time in its header: zero it so the archive, and its hash, are stable
    raw = bytearray(buffer.getvalue())
    raw[4:8] = b"\x00\x00\x00\x00"
    return bytes(raw)


def agent_sha256() -> str:
    return hashlib.sha256(agent_archive()).hexdigest()


def user_data(machine: str, controller_url: str, join_token: str, runtime: str = "docker") -> str:
    """The ``#cloud-config`` of one machine; UserDataTooLarge past Hetzner's limit."""
    settings = {
        "controller_url": controller_url,
        "machine": machine,
        "join_token": join_token,
        "runtime": runtime,
        "poweroff": ["systemctl", "poweroff"],
        # written by the agent at its first join (0600), never here: it rejoins with it
        "credential_file": "/etc/sp00ky/credential",
    }
    document: dict[str, Any] = {
        "write_files": [
            {
                "path": "/etc/sp00ky/agent.json",
                "owner": "root:root",
                "permissions": "0600",
                "content": json.dumps(settings, indent=2) + "\n",
            },
            {
                "path": "/opt/sp00ky/agent.tar.gz",
                "permissions": "0644",
                "encoding": "b64",
                "content": base64.b64encode(agent_archive()).decode(),
            },
            {
                "path": "/opt/sp00ky/install-agent.sh",
                "permissions": "0755",
                "content": (CLOUD_INIT / "install-agent.sh").read_text(),
            },
            {
                "path": "/etc/systemd/system/sp00ky-agent.service",
                "permissions": "0644",
                "content": (CLOUD_INIT / "sp00ky-agent.service").read_text(),
            },
        ],
        "runcmd": [["/opt/sp00ky/install-agent.sh", agent_sha256()]],
    }
    text = "#cloud-config\n" + yaml.safe_dump(document, sort_keys=False, width=1000)
    if len(text.encode()) > USER_DATA_LIMIT:
        raise UserDataTooLarge(
            f"user-data of {machine} is {len(text.encode())} bytes; Hetzner takes at most "
            f"{USER_DATA_LIMIT}"
        )
    return text
