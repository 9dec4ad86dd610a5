"""A pool machine's user-data, built as data and dumped as ``#cloud-config``; and the agent
archive its machine fetches from the controller.

The user-data is small (a test keeps the biggest under 4 KiB of Hetzner's 32): the agent's
settings (controller URL, machine name, runtime, one-time join token: the only secret in it,
never the backend's env; the machine credential of its first join is written by the agent
beside it, never here), the bootstrap (``agent/bootstrap.py``, without its prose) and one
command that runs it with the agent archive's sha256 (and the SSH host keys cloud-init
makes: ed25519 and ecdsa only). The bootstrap fetches the archive from the controller with
the join token, checks it against that sha256 before unpacking anything, and runs its
``install-agent.sh``. The archive holds the agent (its code without comments,
docstrings or unread annotations), ``cloud-init/install-agent.sh`` and the systemd unit
``cloud-init/sp00ky-agent.service``. Its sha256 is pinned where the user-data is rendered, so
a controller must serve the same agent as the program that rendered it (one checkout).
"""

from __future__ import annotations

import ast
import base64
import functools
import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path
from typing import Any

import yaml

from sp00ky_infra.shared.errors import SharedError
from sp00ky_infra.shared.shipped import shipped

# the agent's package, beside this one (in site-packages, or in the checkout)
AGENT = Path(__file__).resolve().parent.parent.parent / "agent"
USER_DATA_LIMIT = 32 * 1024  # Hetzner Cloud's limit on user-data
BOOTSTRAP = AGENT / "bootstrap.py"  # rides in the user-data; not part of the archive
# (where the archive puts it, its mode): the files install-agent.sh installs the agent with
INSTALL_FILES = (("install-agent.sh", 0o755), ("sp00ky-agent.service", 0o644))


def cloud_init_file(name: str) -> Path:
    """A file of ``cloud-init/``, where the package finds it (``shipped``)."""
    return shipped("cloud-init") / name


class UserDataTooLarge(SharedError, ValueError):
    """The user-data is over Hetzner's limit; the message gives its size and the limit."""


def shipped_source(source: bytes, name: str) -> bytes:
    """A module as it ships (the agent in its archive, the bootstrap in the user-data): the
    same code without its comments, docstrings and the type annotations nothing reads at run
    time (``_Unannotated``): smaller to carry and to send. The stripped module must parse to
    the same code, or this refuses to ship it."""
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
    """What the controller serves a booting machine (``GET /v1/machines/{name}/agent``): the
    agent's sources, without what ``shipped_source`` leaves out, and the files it is installed
    with (``INSTALL_FILES``), as a reproducible tar.bz2 (sorted, no times or owners). bzip2
    packs them smaller than gzip or xz; the bootstrap unpacks it with the machine's own
    python3, which needs no decompressor of the image's."""
    buffer = io.BytesIO()
    with tarfile.open(
        fileobj=buffer, mode="w:bz2", compresslevel=9, format=tarfile.PAX_FORMAT
    ) as tar:
        for path in sorted(AGENT.glob("*.py")):
            if path != BOOTSTRAP:
                source = shipped_source(path.read_bytes(), path.name)
                _add(tar, f"agent/{path.name}", source, 0o644)
        for name, mode in INSTALL_FILES:
            _add(tar, name, cloud_init_file(name).read_bytes(), mode)
    return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def bootstrap() -> bytes:
    """``agent/bootstrap.py`` as the user-data carries it."""
    return shipped_source(BOOTSTRAP.read_bytes(), BOOTSTRAP.name)


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
                "path": "/opt/sp00ky/bootstrap.py",
                "permissions": "0700",
                "encoding": "gz+b64",  # cloud-init writes it out as plain text
                "content": base64.b64encode(gzip.compress(bootstrap(), 9, mtime=0)).decode(),
            },
        ],
        "runcmd": [["python3", "/opt/sp00ky/bootstrap.py", agent_sha256()]],
        # The host keys cloud-init makes before the bootstrap runs: an RSA key of 3072 bits
        # alone takes a second or more of the boot, and DSA is obsolete
        "ssh_genkeytypes": ["ed25519", "ecdsa"],
    }
    text = "#cloud-config\n" + yaml.safe_dump(document, sort_keys=False, width=1000)
    if len(text.encode()) > USER_DATA_LIMIT:
        raise UserDataTooLarge(
            f"user-data of {machine} is {len(text.encode())} bytes; Hetzner takes at most "
            f"{USER_DATA_LIMIT}"
        )
    return text
