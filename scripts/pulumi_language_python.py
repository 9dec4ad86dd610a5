"""``pulumi-language-python`` for machines that cannot have the official one.

The pulumi CLI runs a Python program through a language host: a plugin it starts as
``pulumi-language-python [flags] ENGINE_ADDRESS``, which prints the port of its
``pulumirpc.LanguageRuntime`` gRPC service on its first line of output and is then asked to
run the program. The official host is a Go module that no proxy here serves, so
``scripts/pulumi-engine`` installs this one beside the CLI it builds. It runs the program
exactly as the official host does, ``python -u pulumi-language-python-exec --monitor ...
--engine ... PROGRAM`` with the stack's config in ``PULUMI_CONFIG`` and its secret keys in
``PULUMI_CONFIG_SECRET_KEYS``, where ``pulumi-language-python-exec`` is the SDK's own
launcher (from the sdk/v3 Go module at the engine's version), and with the project's
virtualenv (``runtime.options.virtualenv`` in Pulumi.yaml) or ``python3``. A virtualenv
without the pulumi SDK is refused, naming the extra that brings it.

What it leaves out, on purpose: it reports no required plugins or packages (this project's
resources are all dynamic providers, served by ``pulumi-resource-pulumi-python`` beside the
CLI, so nothing is ever downloaded), it installs no dependencies (``scripts/venv`` does), and
it supports the ``pip`` toolchain only; code generation (``pulumi convert``, ``package gen-sdk``)
answers UNIMPLEMENTED.

It runs in a virtualenv of its own with the pulumi SDK of the engine's version (for grpc and the
generated stubs), made by ``scripts/pulumi-engine``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
from google.protobuf import empty_pb2, json_format
from pulumi.runtime.proto import language_pb2, language_pb2_grpc, plugin_pb2

HERE = Path(__file__).resolve().parent
EXEC = HERE / "pulumi-language-python-exec"
VERSION = (HERE / "VERSION").read_text().strip() if (HERE / "VERSION").exists() else "0.0.0"
# The exec script's exit code when it has already shown the user an actionable message.
BAIL_CODE = 32
# As the engine's own gRPC limits: a large stack's config or a program's registrations.
MAX_MESSAGE = 400 * 1024 * 1024


class HostError(Exception):
    """The program cannot be run as asked (an unsupported toolchain, a missing virtualenv)."""


def options_of(info: language_pb2.ProgramInfo) -> dict[str, Any]:
    return json_format.MessageToDict(info.options) if info.HasField("options") else {}


def python_for(info: language_pb2.ProgramInfo) -> str:
    """The interpreter that runs the program: the project's virtualenv, or python3."""
    options = options_of(info)
    toolchain = options.get("toolchain", "pip")
    if toolchain != "pip":
        raise HostError(
            f"runtime.options.toolchain is {toolchain!r}; this language host supports pip only"
        )
    virtualenv = options.get("virtualenv")
    if not virtualenv:
        return os.environ.get("PULUMI_PYTHON_CMD", "python3")
    root = Path(info.root_directory or ".")
    python = (root / virtualenv).resolve() / "bin" / "python"
    if not python.exists():
        raise HostError(
            f"runtime.options.virtualenv is {virtualenv!r}, but {python} does not exist; "
            "create it (scripts/venv) and run again"
        )
    if not has_sdk(python):
        raise HostError(
            f"the Pulumi program needs the pulumi extra in {virtualenv}: {python} -m pip install "
            "'sp00ky-infra[pulumi]' (scripts/venv in a checkout installs every extra)"
        )
    return str(python)


def has_sdk(python: Path) -> bool:
    """Whether ``python`` has the pulumi SDK (looked up, not imported: an import takes a second)."""
    probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('pulumi') is None)"
    done = subprocess.run([str(python), "-c", probe], capture_output=True, timeout=60)
    return done.returncode == 0


def interpreter(info: language_pb2.ProgramInfo, context: grpc.ServicerContext) -> str:
    """python_for, or the call aborted with FAILED_PRECONDITION and the reason."""
    try:
        return python_for(info)
    except HostError as exc:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        raise  # abort raises; this line is for type checkers


def program_of(request: language_pb2.RunRequest) -> str:
    info = request.info
    if info.program_directory:
        entry = info.entry_point or "."
        return str(Path(info.program_directory, entry)) if entry != "." else info.program_directory
    return request.program or "."


class LanguageHost(language_pb2_grpc.LanguageRuntimeServicer):
    def __init__(self, engine: str) -> None:
        self.engine = engine
        self._running: set[subprocess.Popen[bytes]] = set()
        self._lock = threading.Lock()

    def Handshake(
        self, request: language_pb2.LanguageHandshakeRequest, context: grpc.ServicerContext
    ) -> language_pb2.LanguageHandshakeResponse:
        if request.engine_address:
            self.engine = request.engine_address
        return language_pb2.LanguageHandshakeResponse()

    def GetPluginInfo(
        self, request: empty_pb2.Empty, context: grpc.ServicerContext
    ) -> plugin_pb2.PluginInfo:
        return plugin_pb2.PluginInfo(version=VERSION)

    def GetRequiredPlugins(
        self, request: language_pb2.GetRequiredPluginsRequest, context: grpc.ServicerContext
    ) -> language_pb2.GetRequiredPluginsResponse:
        return language_pb2.GetRequiredPluginsResponse()

    def GetRequiredPackages(
        self, request: language_pb2.GetRequiredPackagesRequest, context: grpc.ServicerContext
    ) -> language_pb2.GetRequiredPackagesResponse:
        return language_pb2.GetRequiredPackagesResponse()

    def RuntimeOptionsPrompts(
        self, request: language_pb2.RuntimeOptionsRequest, context: grpc.ServicerContext
    ) -> language_pb2.RuntimeOptionsResponse:
        return language_pb2.RuntimeOptionsResponse()

    def InstallDependencies(
        self, request: language_pb2.InstallDependenciesRequest, context: grpc.ServicerContext
    ) -> Iterator[language_pb2.InstallDependenciesResponse]:
        """Installs nothing: it only checks that the interpreter is there."""
        python = interpreter(request.info, context)
        yield language_pb2.InstallDependenciesResponse(
            stdout=f"using {python}; dependencies are installed by scripts/venv\n".encode()
        )

    def About(
        self, request: language_pb2.AboutRequest, context: grpc.ServicerContext
    ) -> language_pb2.AboutResponse:
        python = interpreter(request.info, context)
        version = subprocess.run(
            [python, "-c", "import platform; print(platform.python_version())"],
            capture_output=True, text=True, check=False,
        ).stdout.strip()  # fmt: skip
        return language_pb2.AboutResponse(executable=python, version=version)

    def GetProgramDependencies(
        self, request: language_pb2.GetProgramDependenciesRequest, context: grpc.ServicerContext
    ) -> language_pb2.GetProgramDependenciesResponse:
        python = interpreter(request.info, context)
        listed = subprocess.run(
            [python, "-m", "pip", "list", "--format", "json", "--disable-pip-version-check"],
            capture_output=True, text=True, check=False,
        )  # fmt: skip
        packages = json.loads(listed.stdout or "[]")
        return language_pb2.GetProgramDependenciesResponse(
            dependencies=[
                language_pb2.DependencyInfo(name=p["name"], version=p["version"]) for p in packages
            ]
        )

    def Run(
        self, request: language_pb2.RunRequest, context: grpc.ServicerContext
    ) -> language_pb2.RunResponse:
        try:
            python = python_for(request.info)
        except HostError as exc:
            return language_pb2.RunResponse(error=str(exc))
        args = [
            python, "-u", str(EXEC),
            "--monitor", request.monitor_address,
            "--engine", self.engine,
            "--project", request.project,
            "--stack", request.stack,
            "--pwd", request.pwd,
            "--parallel", str(request.parallel),
        ]  # fmt: skip
        if request.organization:
            args += ["--organization", request.organization]
        if request.info.root_directory:
            args += ["--root_directory", request.info.root_directory]
        if request.dryRun:
            args += ["--dry_run", "true"]
        args += [program_of(request), *request.args]
        env = dict(os.environ)
        env["PULUMI_CONFIG"] = json.dumps(dict(request.config))
        env["PULUMI_CONFIG_SECRET_KEYS"] = json.dumps(list(request.configSecretKeys))
        proc = subprocess.Popen(args, env=env, cwd=request.pwd or None)
        with self._lock:
            self._running.add(proc)
        try:
            code = proc.wait()
        finally:
            with self._lock:
                self._running.discard(proc)
        if code == 0:
            return language_pb2.RunResponse()
        if code == BAIL_CODE:
            return language_pb2.RunResponse(bail=True)
        return language_pb2.RunResponse(error=f"Program exited with non-zero exit code: {code}")

    def Cancel(self, request: empty_pb2.Empty, context: grpc.ServicerContext) -> empty_pb2.Empty:
        """The engine is stopping (Ctrl-C): the program is asked to stop too."""
        with self._lock:
            for proc in self._running:
                proc.send_signal(signal.SIGINT)
        return empty_pb2.Empty()


def engine_address(argv: list[str]) -> str:
    """The engine's address: the last argument (flags such as ``-root DIR`` come first)."""
    if not argv or argv[-1].startswith("-"):
        raise SystemExit("usage: pulumi-language-python [flags] ENGINE_ADDRESS")
    return argv[-1]


def main(argv: list[str]) -> None:
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=8),
        options=[
            ("grpc.max_receive_message_length", MAX_MESSAGE),
            ("grpc.max_send_message_length", MAX_MESSAGE),
        ],
    )
    language_pb2_grpc.add_LanguageRuntimeServicer_to_server(
        LanguageHost(engine_address(argv)), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    print(port, flush=True)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    server.stop(grace=2).wait()


if __name__ == "__main__":
    main(sys.argv[1:])
