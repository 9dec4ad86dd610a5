"""The image paths a rehearsal can take (``phases.PATHS``): the config a path runs, with
``machine.image`` set for every Hetzner pool.

A path's config is the user's with that one change, written beside it under a hidden name
(so its relative paths, a spec, a dockerfile, an env file, resolve from the same folder) and
removed once the path has run. The baked path's is ``machine.image: baked``: the controller
bakes each pool's snapshot as it does in production (``controller/baking.py``), and the
rehearsal waits for it before the burst, timing it apart from the machines' boots.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from pathlib import Path

import yaml


def path_config(source: Path, images: Mapping[str, str]) -> Path:
    """A copy of the config at ``source``, beside it, whose pools boot ``images`` (pool ->
    machine.image)."""
    doc = yaml.safe_load(source.read_text())
    for pool, image in images.items():
        settings = doc["pools"][pool]
        settings["machine"] = {**(settings.get("machine") or {}), "image": image}
    target = source.with_name(f".{source.stem}.rehearse-{secrets.token_hex(3)}{source.suffix}")
    target.write_text(yaml.safe_dump(doc, sort_keys=False))
    return target
