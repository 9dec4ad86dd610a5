"""A pool machine's user-data, checked by the real `cloud-init schema`: small (the agent is
fetched, not carried), pinning the agent archive by its sha256, and carrying the bootstrap that
fetches it; and the archive the controller serves: the agent as it ships, and what installs it."""

from __future__ import annotations

import ast
import base64
import dataclasses
import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import types
from pathlib import Path

import pytest
import yaml

from sp00ky_infra.controller.bake import BakeRequest, bake_user_data
from sp00ky_infra.controller.images import PoolImage
from sp00ky_infra.controller.registry import RegistryAuth
from sp00ky_infra.shared import tokens
from sp00ky_infra.shared.cloud_init import (
    USER_DATA_LIMIT,
    UserDataTooLarge,
    agent_archive,
    agent_sha256,
    shipped_source,
    user_data,
)
from tests.conftest import need_service
from tests.helpers import ROOT

SECRET = "pool-secret-for-tests"
SMALL = 4 * 1024  # what the user-data stays under, whatever the config


def _schema_checked(text: str, folder: Path) -> None:
    """``text`` passes `cloud-init schema`."""
    if shutil.which("cloud-init") is None:
        need_service(
            "cloud-init", "apt-get install cloud-init (its `schema` command checks user-data)"
        )
    path = folder / "user-data.yaml"
    path.write_text(text)
    checked = subprocess.run(
        ["cloud-init", "schema", "--config-file", str(path)], capture_output=True, text=True
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "Valid" in checked.stdout


def _files(text: str) -> dict[str, bytes]:
    """The files the user-data writes, as cloud-init writes them (path -> content)."""
    files = {}
    for entry in yaml.safe_load(text)["write_files"]:
        content = entry["content"].encode()
        if entry.get("encoding") == "gz+b64":
            content = gzip.decompress(base64.b64decode(content))
        files[entry["path"]] = content
    return files


@pytest.mark.parametrize("machine", ["render-a1", "a-rather-long-machine-name-0123456789"])
def test_user_data_passes_cloud_init_schema_and_fits_hetzners_limit(
    tmp_path: Path, machine: str
) -> None:
    token = tokens.issue_join_token(SECRET, machine, 0, ttl=10**10)
    text = user_data(machine, "https://pool.example.com", token)
    assert text.startswith("#cloud-config\n") and len(text.encode()) <= USER_DATA_LIMIT
    _schema_checked(text, tmp_path)


def test_the_biggest_user_data_stays_under_4_kib_and_passes_cloud_init_schema(
    tmp_path: Path,
) -> None:
    """The longest of everything it carries: a machine name at Hetzner's 63 characters for a
    server's name (a pool's machines have at most 47: a 40-character pool name and a suffix),
    its join token with the longest expiry, the longer runtime, and a controller URL of a DNS
    name at its 253 characters, a port and a path."""
    machine = "m" * 63
    token = tokens.issue_join_token(SECRET, machine, 0, ttl=10**10 - 1)
    host = ".".join(["h" * 63] * 4)[:253]
    url = f"https://{host}:65535/{'p' * 200}"
    text = user_data(machine, url, token, runtime="process")
    assert len(text.encode()) <= SMALL, len(text.encode())
    _schema_checked(text, tmp_path)
    settings = json.loads(_files(text)["/etc/sp00ky/agent.json"])
    assert (settings["machine"], settings["controller_url"]) == (machine, url)
    assert settings["join_token"] == token and settings["runtime"] == "process"


def test_the_bake_user_data_carries_no_agent_and_stays_under_4_kib(tmp_path: Path) -> None:
    """The bake server fetches the agent from the feed: its user-data is the bake script, the
    feed's address and tokens, and the longest image reference with registry credentials."""
    image = PoolImage(
        "registry", f"{'r' * 200}.example/{'n' * 200}@sha256:{'b' * 64}",
        RegistryAuth("u" * 64, "p" * 200, f"{'r' * 200}.example"),
    )  # fmt: skip
    request = BakeRequest(
        "p" * 40, "q" * 40, image, feed_url=f"http://{'h' * 63}:65535", feed_token="t" * 32,
        agent_token="a" * 32,
    )  # fmt: skip
    text = bake_user_data(request)
    assert len(text.encode()) <= SMALL, len(text.encode())
    _schema_checked(text, tmp_path)
    files = _files(text)
    assert set(files) == {"/etc/sp00ky/bake.json", "/opt/sp00ky/bake.py"}
    settings = json.loads(files["/etc/sp00ky/bake.json"])
    assert (settings["url"], settings["agent_token"]) == (request.feed_url, "a" * 32)
    assert yaml.safe_load(text)["runcmd"] == [["python3", "/opt/sp00ky/bake.py", agent_sha256()]]


def test_the_bake_leaves_the_agent_sha256_where_the_bootstrap_reads_it() -> None:
    bootstrap = _module(ROOT / "agent" / "bootstrap.py")
    bake = _module(ROOT / "cloud-init" / "bake.py")
    assert bake.SHA256_FILE == bootstrap.SHA256_FILE
    assert str(bake.HOME) == "/opt/sp00ky"


def _module(path: Path) -> types.ModuleType:
    module = types.ModuleType(path.stem)
    exec(compile(path.read_text(), str(path), "exec"), module.__dict__)
    return module


def _without_docstrings(tree: ast.Module) -> ast.Module:
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                node.body = body[1:] or [ast.Pass()]  # type: ignore[attr-defined]
    return tree


class _Unannotated(ast.NodeTransformer):
    """Every annotation erased, wherever it is: the shipped agent keeps only those a class
    body declares (which the protocol and dataclasses read), and this compares the code."""

    def visit_arg(self, node: ast.arg) -> ast.arg:
        node.annotation = None
        return node

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.FunctionDef:
        node.returns = None
        self.generic_visit(node)
        return node

    def visit_AnnAssign(self, node: ast.AnnAssign) -> ast.Assign | None:
        if node.value is None:
            return None
        return ast.Assign(targets=[node.target], value=node.value, type_comment=None)


def test_the_shipped_agent_imports_and_fits_with_room(tmp_path: Path) -> None:
    """The agent as it ships in its archive (no comments, docstrings or unread annotations)
    imports and runs, and the user-data leaves room under Hetzner's 32 KiB."""
    with tarfile.open(fileobj=io.BytesIO(agent_archive())) as tar:
        tar.extractall(tmp_path, filter="data")
    modules = sorted(
        f"agent.{p.stem}" for p in (tmp_path / "agent").glob("*.py") if p.stem != "__main__"
    )
    imported = subprocess.run(
        [sys.executable, "-c", "import importlib, sys; [importlib.import_module(m) for m in "
         "sys.argv[1:]]; print(sys.modules['agent.main'].__file__)", *modules],
        cwd=tmp_path, capture_output=True, text=True, env={"PATH": os.environ["PATH"]},
    )  # fmt: skip
    assert imported.returncode == 0, imported.stderr
    assert imported.stdout.strip() == str(tmp_path / "agent" / "main.py")
    started = subprocess.run(  # its entry point runs, and says what it lacks
        [sys.executable, "-m", "agent"], cwd=tmp_path, capture_output=True, text=True,
        env={"PATH": os.environ["PATH"]}, timeout=30,
    )  # fmt: skip
    assert started.returncode == 2 and "missing controller_url" in started.stderr, started
    assert len(user_data("m", "https://pool.example.com", "t").encode()) < USER_DATA_LIMIT * 0.85


SOURCE = b'''"""A module."""
from __future__ import annotations
import dataclasses
from typing import get_type_hints
LIMIT: int = 3
@dataclasses.dataclass
class Point:
    """A point."""
    x: int
    y: list[int] = dataclasses.field(default_factory=list)
def scale(point: Point, by: int = LIMIT) -> Point:
    total: int
    total = point.x * by
    return Point(total, [*point.y])
def shadow() -> str:
    LIMIT: int  # declared, never bound here: still local, so reading it fails
    return str(LIMIT)
'''


def test_a_shipped_module_keeps_its_class_fields_and_its_scopes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Stripping leaves what runs as it was: a dataclass's fields (and the hints the protocol
    reads), defaults, and a declaration that makes a name local; functions lose theirs."""
    shipped = shipped_source(SOURCE, "m.py")
    text = shipped.decode()
    assert "-> Point" not in text and "point: Point" not in text and "LIMIT = 3" in text
    assert "total: int" not in text and "LIMIT: int" in text and "A point" not in text
    shipped_module = types.ModuleType("shipped_example")
    monkeypatch.setitem(sys.modules, "shipped_example", shipped_module)  # dataclasses look it up
    exec(compile(shipped, "m.py", "exec"), shipped_module.__dict__)
    module = shipped_module.__dict__
    point = module["scale"](module["Point"](2, [1]))
    assert (point.x, point.y) == (6, [1])
    assert [f.name for f in dataclasses.fields(point)] == ["x", "y"]
    assert module["get_type_hints"](module["Point"]) == {"x": int, "y": list[int]}
    with pytest.raises(UnboundLocalError):
        module["shadow"]()


def test_the_user_data_pins_the_fetched_agent_and_carries_only_its_bootstrap() -> None:
    text = user_data("m", "https://pool.example.com", "t")
    document = yaml.safe_load(text)
    files = _files(text)
    assert set(files) == {"/etc/sp00ky/agent.json", "/opt/sp00ky/bootstrap.py"}
    archive = agent_archive()
    (command,) = document["runcmd"]
    assert command == ["python3", "/opt/sp00ky/bootstrap.py", hashlib.sha256(archive).hexdigest()]
    bootstrap = files["/opt/sp00ky/bootstrap.py"]
    here = _without_docstrings(ast.parse((ROOT / "agent" / "bootstrap.py").read_bytes()))
    assert ast.dump(_Unannotated().visit(ast.parse(bootstrap))) == ast.dump(
        _Unannotated().visit(here)
    )  # the bootstrap carried is the one here, less its prose
    settings = json.loads(files["/etc/sp00ky/agent.json"])
    assert settings["credential_file"] == "/etc/sp00ky/credential"
    assert settings["poweroff"] == ["systemctl", "poweroff"]
    assert document["ssh_genkeytypes"] == ["ed25519", "ecdsa"]  # no RSA key made at boot
    assert user_data("m", "u", "t") == user_data("m", "u", "t")  # reproducible, hash and all


def test_the_agent_archive_holds_the_agent_and_installs_it_as_a_service() -> None:
    archive = agent_archive()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        names = set(tar.getnames())
        modes = {member.name: member.mode for member in tar.getmembers()}
    agent = {f"agent/{p.name}" for p in (ROOT / "agent").glob("*.py") if p.name != "bootstrap.py"}
    assert names == agent | {"install-agent.sh", "sp00ky-agent.service"}
    assert modes["install-agent.sh"] == 0o755
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():  # the code shipped is the code here, less its prose
            if not member.name.startswith("agent/"):
                continue
            shipped = tar.extractfile(member)
            assert shipped is not None
            here = _without_docstrings(ast.parse((ROOT / member.name).read_bytes()))
            code = _Unannotated().visit(ast.parse(shipped.read()))
            assert ast.dump(code) == ast.dump(_Unannotated().visit(here)), member.name
        unit = _member(tar, "sp00ky-agent.service")
        script = _member(tar, "install-agent.sh")
    assert unit == (ROOT / "cloud-init" / "sp00ky-agent.service").read_text()
    assert "ExecStart=/usr/bin/python3 -m agent" in unit and "SPKY_AGENT_SETTINGS_FILE" in unit
    # a refused join or rejoin powers off and exits 3, a failed boot exits 4: never restarted
    (prevent,) = [
        line for line in unit.splitlines() if line.startswith("RestartPreventExitStatus=")
    ]
    assert {"3", "4"} <= set(prevent.split("=", 1)[1].split())
    assert "docker.io" in script and "python3-requests" in script
    assert "systemctl enable --no-reload sp00ky-agent.service" in script  # at every boot
    assert "systemctl start docker.service sp00ky-agent.service" in script  # and now
    assert agent_archive.__wrapped__() == archive  # reproducible


def _member(tar: tarfile.TarFile, name: str) -> str:
    found = tar.extractfile(name)
    assert found is not None
    return found.read().decode()


def test_user_data_past_the_limit_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from sp00ky_infra.shared import cloud_init

    monkeypatch.setattr(cloud_init, "USER_DATA_LIMIT", 1000)
    with pytest.raises(UserDataTooLarge, match="Hetzner takes at most 1000"):
        cloud_init.user_data("m", "u", "t")
