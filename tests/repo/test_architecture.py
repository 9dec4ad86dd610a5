"""ARCHITECTURE.md's map names every module: each part's row of the parts table lists each
module of that part (``tick.py``; ``provisioners/pulumi.py`` below a sub-package), so a new
module cannot land without a place on the map."""

from __future__ import annotations

import re
from pathlib import Path

from tests.helpers import ROOT

SKIPPED = {"__init__.py", "__main__.py"}


def _rows() -> dict[str, str]:
    """The parts table: part -> its row's text (the modules and what the part owns)."""
    rows: dict[str, str] = {}
    text = (ROOT / "ARCHITECTURE.md").read_text()
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("| ") and len(cells) >= 3 and re.fullmatch(r"[a-z_]+", cells[0]):
            rows[cells[0]] = cells[1]
    return rows


def _modules() -> dict[str, list[str]]:
    """part -> its modules, as the map names them (relative to the part's folder)."""
    found: dict[str, list[str]] = {}
    package = ROOT / "sp00ky_infra"
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package)
        if path.name in SKIPPED and len(relative.parts) > 1:
            continue
        if len(relative.parts) == 1:  # a module that is a part of its own: client.py
            found.setdefault(path.stem, []).append(path.name)
            continue
        part, rest = relative.parts[0], Path(*relative.parts[1:])
        found.setdefault(part, []).append(rest.as_posix())
    found["agent"] = [
        p.name for p in sorted((ROOT / "agent").glob("*.py")) if p.name not in SKIPPED
    ]
    found.pop("__init__", None)
    found.pop("__main__", None)
    return found


def test_every_part_has_a_row_and_every_module_is_named_in_it() -> None:
    rows = _rows()
    missing = {
        part: [name for name in names if f"`{name}`" not in rows.get(part, "")]
        for part, names in _modules().items()
    }
    missing = {part: names for part, names in missing.items() if names}
    assert not missing, f"ARCHITECTURE.md's parts table does not name: {missing}"


def test_the_map_names_no_module_that_does_not_exist() -> None:
    modules = _modules()
    for part, row in _rows().items():
        named = re.findall(r"`([a-z_/]+\.py)`", row)
        # a module of the part, or another part's named by its path (`controller/protocol.py`)
        gone = [
            name
            for name in named
            if name not in modules.get(part, []) and not (ROOT / "sp00ky_infra" / name).is_file()
        ]
        assert not gone, f"ARCHITECTURE.md names {gone} in part {part}, which has no such module"
