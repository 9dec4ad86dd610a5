"""The language host (scripts/pulumi_language_python.py) runs the program with the project's
virtualenv, and refuses one without the pulumi SDK, naming the extra that brings it."""

from __future__ import annotations

import importlib.util
import sys
import venv
from pathlib import Path
from types import ModuleType

import pytest
from google.protobuf import struct_pb2
from pulumi.runtime.proto import language_pb2

from tests.helpers import ROOT


@pytest.fixture(scope="module")
def host() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "pulumi_language_python", ROOT / "scripts/pulumi_language_python.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _info(root: Path, virtualenv: str) -> language_pb2.ProgramInfo:
    options = struct_pb2.Struct()
    options.update({"toolchain": "pip", "virtualenv": virtualenv})
    return language_pb2.ProgramInfo(root_directory=str(root), options=options)


def test_a_virtualenv_without_the_sdk_names_the_extra(host: ModuleType, tmp_path: Path) -> None:
    venv.create(tmp_path / "bare", with_pip=False)
    with pytest.raises(host.HostError) as refused:
        host.python_for(_info(tmp_path, "bare"))
    assert str(refused.value) == (
        f"the Pulumi program needs the pulumi extra in bare: {tmp_path / 'bare/bin/python'} -m "
        "pip install 'sp00ky-infra[pulumi]' (scripts/venv in a checkout installs every extra)"
    )


def test_a_virtualenv_with_the_sdk_runs_the_program(host: ModuleType) -> None:
    venv_dir = Path(sys.prefix)
    python = host.python_for(_info(venv_dir.parent, venv_dir.name))
    assert python == str(venv_dir.resolve() / "bin/python")
