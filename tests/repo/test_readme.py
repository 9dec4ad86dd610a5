"""The README stays true: its first commands exist, its reference is the schema's."""

from __future__ import annotations

import os
import re

from sp00ky_infra.config.reference import BEGIN, END, markdown
from sp00ky_infra.config.rules import RULES
from tests.helpers import ROOT

README = (ROOT / "README.md").read_text()


def test_starts_with_the_two_commands() -> None:
    first_block = re.search(r"```sh\n(.*?)```", README, re.S)
    assert first_block is not None and README.index("```sh") < 40
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["./scripts/demo", "./scripts/test"]
    for command in commands:
        path = ROOT / command
        assert path.is_file() and os.access(path, os.X_OK), command


def test_ci_runs_the_readme_test_command() -> None:
    ci = (ROOT / ".ci" / "run").read_text()
    assert re.search(r"^exec scripts/test\b", ci, re.M)


def test_configuration_reference_is_generated_from_the_schema() -> None:
    start, end = README.index(BEGIN), README.index(END) + len(END)
    assert README[start:end] == markdown(), "run: sp00ky-infra schema --markdown"


def test_every_rule_is_documented() -> None:
    for each in RULES:
        assert f"| {each.code} | {each.summary} |" in README


# Paths a reader may find named in the README that are made at run time, not files in the repo.
RUNTIME_PATHS = ("./.sp00ky/", ".sp00ky/", "/openapi.json", "/v1/openapi.json", "/var/log/")
TOP_LEVEL = (
    *sorted(
        entry.name + "/" for entry in ROOT.iterdir() if entry.is_dir() and entry.name[0] != "."
    ),
    ".ci/",
)


def test_the_readme_stands_alone() -> None:
    """No pointer to a file outside the repository: the product documents are not shipped, so
    none is named as a `.txt` file, no path leaves the repository, and every
    link and every path under a top-level directory names a file that is here."""
    assert not re.findall(r"[\w-]+\.txt\b", README), "a .txt"
    assert "/work/" not in README and "../shared" not in README
    for target in re.findall(r"\]\(([^)#]+)\)", README):
        if not target.startswith(("http://", "https://")):
            assert (ROOT / target).exists(), target
    for quoted in re.findall(r"`([^`\s]+)`", README):
        path = quoted.rstrip(".,:;")
        if path.startswith(RUNTIME_PATHS) or any(c in path for c in "<>*{}$"):
            continue
        if path.startswith("../") and not path.startswith("../.venv/"):
            raise AssertionError(f"{path} points outside the repository")
        if path.startswith(TOP_LEVEL):
            assert (ROOT / path.split(":")[0]).exists(), path
