"""The stack's program as the controller runs it, in its own process: the project's own
``__main__.py``, run as ``__main__`` and marked as the controller's run for that run only."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sp00ky_infra.controller.provisioners.inline import project_program
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
