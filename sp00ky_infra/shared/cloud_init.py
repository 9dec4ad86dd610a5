"""A pool machine's user-data: built as data, dumped as ``#cloud-config``.

It writes the agent's settings (controller URL, machine name, one-time join token: the only
secret in it, never the backend's env; the machine credential of its first join is written
by the agent beside it, never here), installs the agent, pinned by sha256 and embedded
compressed (its code without comments, docstrings or unread annotations), with
``cloud-init/install-agent.sh``, and runs it as the systemd service of
``cloud-init/sp00ky-agent.service``. Hetzner takes at most 32 KiB of user-data.
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
    """A module as it ships in user-data: the same code without its comments, docstrings and
    the type annotations nothing reads at run time (``_Unannotated``): the agent's sources as
    written, compressed, do not fit in Hetzner's 32 KiB. The stripped module must parse to the
    same code, or this refuses to ship it."""
    tree = _Unannotated().visit(ast.parse(source, name))
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                node.body = node.body[1:] or [ast.Pass()]
        if not isinstance(node, ast.Module) and getattr(node, "body", None) == []:
            node.body = [ast.Pass()]  # type: ignore[attr-defined]  # it held only a declaration
    shipped = ast.unparse(tree) + "\n"
    if ast.dump(ast.parse(shipped, name)) != ast.dump(tree):
        raise SharedError(f"{name}: the agent's module does not survive stripping unchanged")
    return shipped.encode()


class _Unannotated(ast.NodeTransformer):
    """Drops the annotations the agent never reads (under ``from __future__ import
    annotations`` they are strings nothing evaluates): its functions' arguments and returns,
    and those of assignments outside a class body. A class body keeps its own: they make a
    dataclass's fields, and the protocol reads them (``get_type_hints``). A bare declaration
    in a function goes only where the function binds the name anyway, so it stays local."""

    def __init__(self) -> None:
        # the scopes around: a function's, the names it binds; a class body's, None
        self.scopes: list[set[str] | None] = []

    def visit_FunctionDef(self, node: Any) -> Any:
        arguments = node.args
        every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
        for argument in [*every, arguments.vararg, arguments.kwarg]:
            if argument is not None:
                argument.annotation = None
        node.returns = None
        return self._within(node, _bound_names(node))

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_ClassDef(self, node: ast.ClassDef) -> Any:
        return self._within(node, None)

    def _within(self, node: ast.AST, scope: set[str] | None) -> ast.AST:
        self.scopes.append(scope)
        self.generic_visit(node)
        self.scopes.pop()
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.stmt | None:
        scope = self.scopes[-1] if self.scopes else set()
        if scope is None:
            return node
        if node.value is not None:
            plain = ast.Assign(targets=[node.target], value=node.value, type_comment=None)
            return ast.copy_location(plain, node)
        if isinstance(node.target, ast.Name) and node.target.id in scope:
            return None
        return node


def _bound_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """The names ``function`` itself binds, outside any nested scope (one bound only in a
    comprehension or a ``match`` leaves its declaration in place: the safe way round)."""
    names: set[str] = set()
    pending: list[ast.AST] = list(function.body)
    while pending:
        node = pending.pop()
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((each.asname or each.name).split(".")[0] for each in node.names)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
            continue
        elif isinstance(node, ast.AnnAssign) and node.value is None:
            continue  # a declaration, not a binding
        nested = ast.Lambda | ast.ListComp | ast.SetComp | ast.DictComp | ast.GeneratorExp
        if not isinstance(node, nested):
            pending.extend(ast.iter_child_nodes(node))
    return names


@functools.cache
def agent_archive() -> bytes:
    """The agent's sources as a reproducible tar.bz2 (sorted, no times or owners), without what
    ``shipped_source`` leaves out. bzip2 packs them smaller than gzip or xz; the machine
    unpacks it with its own python3 (``cloud-init/install-agent.sh``), which needs no
    decompressor of the image's."""
    buffer = io.BytesIO()
    with tarfile.open(
        fileobj=buffer, mode="w:bz2", compresslevel=9, format=tarfile.PAX_FORMAT
    ) as tar:
        for path in sorted(AGENT.glob("*.py")):
            info = tarfile.TarInfo(f"agent/{path.name}")
            data = shipped_source(path.read_bytes(), path.name)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


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
                "path": "/opt/sp00ky/agent.tar.bz2",
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
