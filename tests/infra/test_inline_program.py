"""The stack's program as the controller runs it, in its own process: the project's own
``__main__.py``, run as ``__main__`` and marked as the controller's run for that run only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sp00ky_infra.controller.provisioners.inline import GRPC_FORK_SUPPORT_ENV, project_program
from sp00ky_infra.shared.desired import CONTROLLER, UPDATED_BY_ENV, updated_by

PROGRAM = """
import json, os
from sp00ky_infra.shared.desired import updated_by
here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "seen.json"), "w") as out:
    json.dump({"name": __name__, "by": updated_by()}, out)
"""


def test_the_program_runs_as_main_marked_as_the_controllers_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(UPDATED_BY_ENV, raising=False)
    (tmp_path / "__main__.py").write_text(PROGRAM)
    program = project_program(str(tmp_path))

    program()

    assert json.loads((tmp_path / "seen.json").read_text()) == {
        "name": "__main__",
        "by": CONTROLLER,
    }
    assert updated_by() is None  # the mark ends with the run
    assert UPDATED_BY_ENV not in os.environ


def test_a_run_by_hand_carries_no_mark(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(UPDATED_BY_ENV, raising=False)
    assert updated_by() is None
    monkeypatch.setenv(UPDATED_BY_ENV, CONTROLLER)  # the CLI's environment, set by the controller
    assert updated_by() == CONTROLLER


def test_a_folder_without_the_program_is_refused_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="SPKY_PULUMI_DIR") as refused:
        project_program(str(tmp_path))
    assert str(tmp_path / "__main__.py") in str(refused.value)


FORKS = """
import subprocess, sys
from concurrent import futures
from sp00ky_infra.controller.provisioners.inline import without_grpc_fork_support
without_grpc_fork_support()
import grpc
server = grpc.server(futures.ThreadPoolExecutor(4))
port = server.add_insecure_port("127.0.0.1:0")
server.start()
channel = grpc.insecure_channel(f"127.0.0.1:{port}")  # kept open, as the SDK keeps its own
grpc.channel_ready_future(channel).result(timeout=10)
server.stop(0)
for _ in range(60):  # children that run Python before they exec, as a preexec_fn does
    child = subprocess.run([sys.executable, "-c", "print('ok')"], capture_output=True,
                           text=True, preexec_fn=lambda: None, timeout=30)
    print(repr((child.stdout.strip(), child.stderr)))
"""


def test_a_process_that_ran_grpc_forks_clean_children(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != GRPC_FORK_SUPPORT_ENV}
    done = subprocess.run(
        [sys.executable, "-c", FORKS], capture_output=True, text=True, env=env, timeout=120,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    children = done.stdout.splitlines()
    assert len(children) == 60 and set(children) == {repr(("ok", ""))}
