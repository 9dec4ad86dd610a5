"""Who leads a store, as the command line finds it: ``.sp00ky/controller.json``.

Only the leader writes the file, when it gains leadership; a standby (a second ``dev`` or
controller on the same store, waiting) leaves it alone, so ``pools pause`` and the other
admin commands reach the controller that acts. A standby's admin API refuses writes with
the leader's URL read from here.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TypedDict

STATE_FILE = "controller.json"


class LeaderRecord(TypedDict):
    role: str  # "leader"
    controller_id: str
    pid: int
    admin_url: str
    agents_url: str


def state_file(state_dir: str | Path) -> Path:
    return Path(state_dir) / STATE_FILE


def write_leader(state_dir: str | Path, record: LeaderRecord) -> Path:
    """Replace the file in one rename (a reader never sees half of it)."""
    path = state_file(state_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{STATE_FILE}.{os.getpid()}")
    partial.write_text(json.dumps(record, indent=2) + "\n")
    partial.replace(path)
    return path


def read_leader(state_dir: str | Path) -> LeaderRecord | None:
    """The record the last leader wrote, or None (no file, or not one of ours)."""
    try:
        found = json.loads(state_file(state_dir).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or not isinstance(found.get("admin_url"), str):
        return None
    return LeaderRecord(
        role=str(found.get("role", "leader")),
        controller_id=str(found.get("controller_id", "")),
        pid=int(found.get("pid", 0) or 0),
        admin_url=found["admin_url"],
        agents_url=str(found.get("agents_url", "")),
    )


def leader_url(state_dir: str | Path, me: str) -> str | None:
    """The admin URL of the leader named in the state file, unless that is ``me``."""
    record = read_leader(state_dir)
    if record is None or record["controller_id"] == me:
        return None
    return record["admin_url"]
