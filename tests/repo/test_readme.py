"""The README stays true and short, and the pages it promises under docs/ stay true: its first
commands exist, each page is one link away, every link and anchor lands, the configuration
reference is the schema's."""

from __future__ import annotations

import os
import re
from pathlib import Path

from sp00ky_infra.config.reference import PAGE, generated_part, markdown
from sp00ky_infra.config.rules import RULES
from tests.helpers import ROOT

README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").rglob("*.md"))
# The pages the README promises, each with what it must hold (a heading of its own).
PROMISED = {
    "docs/jobs.md": ["## Limits", "## Schedules"],
    "docs/pools.md": ["## Images", "## Baked images", "## Provisioners", "## The agent",
                      "## Simulating a pool's settings"],
    "docs/production.md": ["## Deploying with Pulumi", "## Production: a Hetzner pool from nothing",
                           "## Rehearse it first: `sp00ky-infra rehearse`",
                           "## Two controllers behind one URL", "## The guardian"],
    "docs/operations.md": ["## Why is my job still pending? `explain`",
                           "## A remote controller: `login` and `--cloud`", "## Metrics",
                           "## Cost", "## The admin MCP server"],
    "docs/configuration.md": ["## Reference"],
    "docs/development.md": [],
    "docs/internals/store-and-dispatch.md": ["## The store", "## Dispatch"],
}  # fmt: skip


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


def test_the_readme_is_read_in_five_minutes() -> None:
    assert len(README.splitlines()) < 300
    assert "## Your own backend in five minutes" in README
    assert README.index("## Your own backend") < README.index("## Jobs")


def test_every_page_is_one_link_from_the_readme_and_holds_what_it_promises() -> None:
    linked = set(re.findall(r"\]\((docs/[^)#]+\.md)\)", README))
    assert linked == set(PROMISED), "each page under docs/ is linked from the README"
    assert {page.relative_to(ROOT).as_posix() for page in DOCS} == set(PROMISED)
    for page, headings in PROMISED.items():
        lines = (ROOT / page).read_text().splitlines()
        missing = [heading for heading in headings if heading not in lines]
        assert not missing, f"{page} lacks {missing}"


def test_configuration_reference_is_generated_from_the_schema() -> None:
    page = (ROOT / PAGE).read_text()
    assert generated_part(page) == markdown(), "run: python -m sp00ky_infra.config.reference"
    assert not generated_part(README), "the reference lives in docs/configuration.md only"


def test_every_rule_is_documented() -> None:
    page = (ROOT / PAGE).read_text()
    for each in RULES:
        assert f"| {each.code} | {each.summary} |" in page


def _anchors(text: str) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation dropped, spaces to -."""
    found = set()
    for heading in re.findall(r"^#+ (.+)$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        found.add(slug)
    return found


def test_every_link_and_anchor_lands() -> None:
    for page in [ROOT / "README.md", ROOT / "ARCHITECTURE.md", ROOT / "bench" / "README.md", *DOCS]:
        text = page.read_text()
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]+))?\)", text):
            if target.startswith(("http://", "https://")):
                continue
            where = (page.parent / target).resolve() if target else page
            assert where.exists(), f"{page.name}: {target}"
            if anchor and where.suffix == ".md":
                assert anchor in _anchors(where.read_text()), f"{page.name}: {target}#{anchor}"


# Paths a reader may find named in the README that are made at run time, not files in the repo.
RUNTIME_PATHS = ("./.sp00ky/", ".sp00ky/", "/openapi.json", "/v1/openapi.json", "/var/log/")
TOP_LEVEL = (
    *sorted(
        entry.name + "/" for entry in ROOT.iterdir() if entry.is_dir() and entry.name[0] != "."
    ),
    ".ci/",
)


def _stands_alone(name: str, text: str) -> None:
    assert not re.findall(r"[\w-]+\.txt\b", text), f"{name}: a .txt"
    assert "/work/" not in text and "../shared" not in text, name
    for quoted in re.findall(r"`([^`\s]+)`", text):
        path = quoted.rstrip(".,:;")
        if path.startswith(RUNTIME_PATHS) or any(c in path for c in "<>*{}$"):
            continue
        if path.startswith("../") and not path.startswith("../.venv/"):
            raise AssertionError(f"{name}: {path} points outside the repository")
        if path.startswith(TOP_LEVEL):
            assert (ROOT / path.split(":")[0]).exists(), f"{name}: {path}"


def test_the_readme_and_its_pages_stand_alone() -> None:
    """No pointer to a file outside the repository: the product documents are not shipped, so
    none is named as a `.txt` file, no path leaves the repository, and every path under a
    top-level directory names a file that is here."""
    _stands_alone("README.md", README)
    for page in DOCS:
        _stands_alone(page.relative_to(ROOT).as_posix(), page.read_text())


def test_no_sentence_of_the_docs_is_measurement_history() -> None:
    """Figures and their dates live in bench/README.md; the README and its pages link there."""
    for page in [ROOT / "README.md", *DOCS]:
        text = page.read_text()
        assert not re.search(r"\b20\d\d-\d\d-\d\d, (on the )?2-core", text), page.name
        assert "development machine" not in text, page.name


def test_a_docs_path_named_in_the_code_exists() -> None:
    """Comments and messages that send a reader to a page name one that is here."""
    for path in [*Path(ROOT / "sp00ky_infra").rglob("*.py"), *Path(ROOT / "agent").rglob("*.py")]:
        for named in re.findall(r"\bdocs/[\w/.-]+\.md", path.read_text()):
            assert (ROOT / named).is_file(), f"{path.relative_to(ROOT)} names {named}"
