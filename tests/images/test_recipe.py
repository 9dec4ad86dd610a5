"""A baked snapshot's recipe: its hash, its labels and the selectors that find it."""

from __future__ import annotations

import dataclasses

from sp00ky_infra.rehearse.catalog import matches
from sp00ky_infra.shared.recipe import Recipe, pool_selector

AGENT = "a" * 64
IMAGE = "registry.example/render@sha256:" + "b" * 64
RECIPE = Recipe("debian-12", AGENT, IMAGE)


def test_the_hash_is_short_stable_and_changes_with_each_ingredient() -> None:
    assert RECIPE.hash == Recipe("debian-12", AGENT, IMAGE).hash
    assert len(RECIPE.hash) == 16 and int(RECIPE.hash, 16) >= 0
    changed = [
        dataclasses.replace(RECIPE, base="ubuntu-24.04"),
        dataclasses.replace(RECIPE, agent_sha256="c" * 64),
        dataclasses.replace(RECIPE, image="sha256:" + "d" * 64),
    ]
    assert len({RECIPE.hash, *(r.hash for r in changed)}) == 4


def test_the_labels_name_the_project_the_pool_and_the_recipe() -> None:
    assert RECIPE.labels("shop", "render") == {
        "sp00ky/project": "shop",
        "sp00ky/pool": "render",
        "sp00ky/role": "snapshot",
        "sp00ky/recipe": RECIPE.hash,
    }


def test_the_selectors_find_the_recipe_and_every_snapshot_of_the_pool() -> None:
    mine = RECIPE.labels("shop", "render")
    older = dataclasses.replace(RECIPE, image="sha256:" + "e" * 64).labels("shop", "render")
    other_pool = RECIPE.labels("shop", "encode")
    other_project = RECIPE.labels("blog", "render")
    selector = RECIPE.selector("shop", "render")
    assert [matches(x, selector) for x in (mine, older, other_pool, other_project)] == [
        True, False, False, False,
    ]  # fmt: skip
    every = pool_selector("shop", "render")
    assert [matches(x, every) for x in (mine, older, other_pool, other_project)] == [
        True, True, False, False,
    ]  # fmt: skip
