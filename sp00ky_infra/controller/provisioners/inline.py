"""The stack's program run in the controller's own process (Pulumi's inline programs).

The pulumi CLI still plans and applies each update, but it asks this process to run the
project's ``__main__.py`` instead of starting a language host and a Python of its own for the
program: about a second of every `pulumi up` before the first server is asked for, and the
program's imports are already warm here. The program is the project's own file, run as the
CLI's launcher runs it (``runpy``, as ``__main__``); the mark that only the controller's runs
take machines away travels with it (``shared.desired.UPDATED_BY``), since the CLI's
environment never reaches a program run here. The dynamic provider host the CLI still starts
runs on this interpreter (``PULUMI_PYTHON_CMD``), which has the program's packages.
"""

from __future__ import annotations

import gc
import os
import runpy
import threading
from collections.abc import Callable, Mapping, MutableMapping
from pathlib import Path
from typing import Any

from sp00ky_infra.shared.desired import CONTROLLER, UPDATED_BY

__all__ = ["InlineStack", "project_program", "without_grpc_fork_support"]

GRPC_FORK_SUPPORT_ENV = "GRPC_ENABLE_FORK_SUPPORT"


def without_grpc_fork_support() -> None:
    """Before this process first imports grpc (an inline program's language server is
    grpc's): its fork support off, unless set. This process forks only to run another program,
    and grpc's handlers at a fork restart its pollers in the child, which then wrote errors
    into, or stalled, a child that runs Python before it execs (``preexec_fn``)."""
    os.environ.setdefault(GRPC_FORK_SUPPORT_ENV, "false")


# The SDK keeps a running program's state per process: one inline program at a time.
_RUNS = threading.Lock()


def project_program(work_dir: str) -> Callable[[], None]:
    """The project's ``__main__.py`` as an inline program, marked as the controller's run;
    FileNotFoundError names the file when the project has none."""
    main = Path(work_dir).resolve() / "__main__.py"
    if not main.is_file():
        raise FileNotFoundError(
            f"{main} does not exist: SPKY_PULUMI_DIR must be the sp00ky-infra Pulumi project "
            "(the folder with Pulumi.yaml and __main__.py)"
        )

    def program() -> None:
        mark = UPDATED_BY.set(CONTROLLER)
        try:
            runpy.run_path(str(main), run_name="__main__")
        finally:
            UPDATED_BY.reset(mark)

    return program


class InlineStack:
    """An automation API stack whose ``up`` runs ``program`` in this process; everything else
    goes to the stack as it is."""

    def __init__(self, stack: Any, program: Callable[[], None]) -> None:
        self._stack = stack
        self._program = program

    def up(
        self,
        *,
        on_output: Callable[[str], Any] | None = None,
        on_event: Callable[[Any], Any] | None = None,
    ) -> Any:
        with _RUNS:
            try:
                return self._stack.up(on_output=on_output, on_event=on_event, program=self._program)
            except Exception:
                # An update the engine ended mid-program leaves the SDK's coroutine of it
                # behind: finalised now, not by a later collection in the middle of other work
                gc.collect()
                raise

    def get_all_config(self) -> Mapping[str, Any]:
        return self._stack.get_all_config()  # type: ignore[no-any-return]

    def set_config(self, key: str, value: Any, *, path: bool = False) -> None:
        self._stack.set_config(key, value, path=path)

    def outputs(self) -> MutableMapping[str, Any]:
        return self._stack.outputs()  # type: ignore[no-any-return]

    @property
    def name(self) -> str:
        return str(self._stack.name)

    @property
    def workspace(self) -> Any:
        return self._stack.workspace

    def export_stack(self) -> Any:
        return self._stack.export_stack()

    def import_stack(self, state: Any) -> None:
        self._stack.import_stack(state)
