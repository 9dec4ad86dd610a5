"""Client.run: the docs' db.run(), checked against sp00ky.yml and the backend's OpenAPI spec."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sp00ky_infra.client import Client, check_payload
from sp00ky_infra.store import InvalidJob, QueueFull, SqlStore
from tests.configs import DELETE, varied
from tests.helpers import ROOT

T0 = 1_700_000_000.0


def _project(tmp_path: Path, *changes: tuple[str, Any]) -> Path:
    (tmp_path / "backend").mkdir(exist_ok=True)
    shutil.copy(ROOT / "examples/backend/openapi.yml", tmp_path / "backend/openapi.yml")
    path = tmp_path / "sp00ky.yml"
    path.write_text(yaml.safe_dump(varied(*changes)))
    return path


@pytest.fixture
def client(tmp_path: Path, store: SqlStore) -> Iterator[Client]:
    yield Client(store, _project(tmp_path))


def test_run_writes_a_pending_job_with_the_pools_settings(client: Client) -> None:
    job = client.run("renderer", "/render", {"gameId": "g1"}, priority=3, now=T0)
    assert (job.status, job.table, job.pool, job.priority) == ("pending", "render_job", "render", 3)
    assert job.queue_timeout == 3600 and job.queue_deadline == T0 + 3600
    assert job.max_job_duration == 8 * 3600
    assert client.store.get(job.id) == job


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ({"format": "mp4"}, "payload.gameId is required"),
        ({"gameId": "g", "seconds": "slow"}, "payload.seconds: 'slow' is not of type 'number'"),
        ({"gameId": "g", "format": "avi"}, "payload.format: 'avi' is not one of"),
        ({"gameId": "g", "colour": "red"}, "payload.colour is not a field of this route"),
        (None, "a payload is required and none was given; pass one (run --payload JSON)"),
    ],
)
def test_a_payload_the_spec_refuses_writes_nothing(
    client: Client, payload: Any, message: str
) -> None:
    with pytest.raises(
        InvalidJob, match="refused by backend renderer's spec \\(POST /render\\)"
    ) as e:
        client.run("renderer", "/render", payload, now=T0)
    assert message in str(e.value)
    assert client.store.counts()["pending"] == 0


def test_unknown_backend_and_route(client: Client) -> None:
    with pytest.raises(
        InvalidJob, match=r"backend: no backend 'paint' in sp00ky.yml \(backends: renderer\)"
    ):
        client.run("paint", "/render", {"gameId": "g"})
    with pytest.raises(
        InvalidJob,
        match="path: backend renderer's spec has no POST /paint; its POST routes: /render",
    ):
        client.run("renderer", "/paint", {})


def test_a_timeout_longer_than_max_job_duration(tmp_path: Path, store: SqlStore) -> None:
    strict = Client(store, _project(tmp_path))
    with pytest.raises(
        InvalidJob, match=r"timeout: 9h is longer than pool render's maxJobDuration \(8h\)"
    ):
        strict.run("renderer", "/render", {"gameId": "g"}, timeout=9 * 3600)
    short = strict.run("renderer", "/render", {"gameId": "g"}, timeout=60, now=T0)
    assert short.timeout == 60

    loose = Client(store, _project(tmp_path, ("apps.renderer.timeoutOverridable", True)))
    long = loose.run("renderer", "/render", {"gameId": "g"}, timeout=9 * 3600, now=T0)
    (running,) = [j for j in store.claim("render_job", 2, "c", T0, 90) if j.id == long.id]
    assert running.deadline == T0 + 8 * 3600  # a timeout never extends maxJobDuration


def test_slots_must_fit_a_machine(tmp_path: Path, store: SqlStore) -> None:
    client = Client(store, _project(tmp_path, ("pools.render.slots", 2)))
    assert client.run("renderer", "/render", {"gameId": "g"}, slots=2).slots == 2
    with pytest.raises(InvalidJob, match="asks for 3 slots but a machine of pool 'render' has 2"):
        client.run("renderer", "/render", {"gameId": "g"}, slots=3)


def test_max_queued(tmp_path: Path, store: SqlStore) -> None:
    client = Client(store, _project(tmp_path, ("pools.render.maxQueued", 2)))
    for _ in range(2):
        client.run("renderer", "/render", {"gameId": "g"})
    with pytest.raises(QueueFull, match=r"raise pools\.render\.maxQueued"):
        client.run("renderer", "/render", {"gameId": "g"})


def test_refs_into_components_resolve(tmp_path: Path, store: SqlStore) -> None:
    path = _project(tmp_path)
    (tmp_path / "backend/openapi.yml").write_text(
        yaml.safe_dump(
            {
                "openapi": "3.1.0",
                "info": {"title": "t", "version": "1"},
                "paths": {
                    "/render": {
                        "post": {
                            "requestBody": {
                                "content": {
                                    "application/json": {
                                        "schema": {"$ref": "#/components/schemas/Render"}
                                    }
                                }
                            }
                        }
                    }
                },
                "components": {
                    "schemas": {
                        "Render": {
                            "type": "object",
                            "required": ["scene"],
                            "properties": {"scene": {"type": "string"}},
                        }
                    }
                },
            }
        )
    )
    client = Client(store, path)
    assert client.run("renderer", "/render", {"scene": "s"}).payload == {"scene": "s"}
    with pytest.raises(InvalidJob, match=r"payload\.scene is required"):
        client.run("renderer", "/render", {"gameId": "g"})


def test_an_edited_spec_is_what_the_next_run_is_checked_against(
    tmp_path: Path, store: SqlStore
) -> None:
    """The payload's validator is made once per version of the spec, not kept past an edit."""
    client = Client(store, _project(tmp_path))
    spec_path = tmp_path / "backend/openapi.yml"
    with pytest.raises(InvalidJob, match=r"payload\.scene"):
        client.run("renderer", "/render", {"gameId": "g", "scene": "s"})  # no such property
    spec = yaml.safe_load(spec_path.read_text())
    schema = spec["paths"]["/render"]["post"]["requestBody"]["content"]["application/json"]
    schema["schema"]["properties"]["scene"] = {"type": "string"}
    spec_path.write_text(yaml.safe_dump(spec))
    stat = spec_path.stat()  # a later modification time, whatever the clock's resolution
    os.utime(spec_path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    job = client.run("renderer", "/render", {"gameId": "g", "scene": "s"})
    assert job.payload == {"gameId": "g", "scene": "s"}


def test_a_backend_without_a_spec_takes_any_json(tmp_path: Path, store: SqlStore) -> None:
    client = Client(store, _project(tmp_path, ("apps.renderer.spec", DELETE)))
    assert client.run("renderer", "/anything", [1, 2]).payload == [1, 2]


def test_a_backend_no_pool_runs_is_refused_before_any_row(tmp_path: Path, store: SqlStore) -> None:
    worker = {"type": "backend", "method": {"type": "outbox", "table": "mail_job"}}
    client = Client(store, _project(tmp_path, ("apps.mailer", worker)))
    with pytest.raises(InvalidJob, match=r"'mailer' has no `runOn: \{ pool: NAME \}`, so no pool"):
        client.run("mailer", "/send", {"to": "a@example.com"})
    assert store.counts() == {status: 0 for status in store.counts()}  # nothing was written


def test_the_docs_names_queue_priority_and_pool_slots(tmp_path: Path, store: SqlStore) -> None:
    client = Client(store, _project(tmp_path, ("pools.render.slots", 2)))
    job = client.run("renderer", "/render", {"gameId": "g"}, queue_priority=5, pool_slots=2)
    assert (job.priority, job.slots) == (5, 2)
    same = client.run("renderer", "/render", {"gameId": "g"}, priority=1, queue_priority=1)
    assert (same.priority, same.slots) == (1, 1)
    with pytest.raises(
        InvalidJob,
        match=r"^priority \(1\) and queue_priority \(2\) are two names for one setting "
        "and disagree; give one of them$",
    ):
        client.run("renderer", "/render", {"gameId": "g"}, priority=1, queue_priority=2)
    with pytest.raises(InvalidJob, match=r"^slots \(2\) and pool_slots \(1\) are two names"):
        client.run("renderer", "/render", {"gameId": "g"}, slots=2, pool_slots=1)
    with pytest.raises(InvalidJob, match="asks for 3 slots but a machine of pool 'render' has 2"):
        client.run("renderer", "/render", {"gameId": "g"}, pool_slots=3)
    with pytest.raises(InvalidJob, match=r"^slots: a job takes 1 to 1024 slots, not 0$"):
        client.run("renderer", "/render", {"gameId": "g"}, slots=0)
    assert store.counts()["pending"] == 2


BIG = 9_007_199_254_740_993  # 2**53 + 1: no float is it


def _orders_spec(tmp_path: Path) -> str:
    """A spec whose POST /order body reaches its fields through $refs into components."""
    order = {
        "type": "object",
        "required": ["id", "items"],
        "additionalProperties": False,
        "properties": {
            "id": {"type": "integer", "minimum": 1, "maximum": BIG},
            "items": {"type": "array", "items": {"$ref": "#/components/schemas/Item"}},
        },
    }
    item = {"type": "object", "required": ["sku"], "properties": {"sku": {"type": "string"}}}
    body = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Order"}}}}
    spec = {
        "openapi": "3.1.0",
        "info": {"title": "t", "version": "1"},
        "paths": {"/order": {"post": {"requestBody": body}}},
        "components": {"schemas": {"Order": order, "Item": item}},
    }
    path = tmp_path / "orders.yml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_every_refused_field_is_named_through_refs(tmp_path: Path) -> None:
    with pytest.raises(InvalidJob) as refused:
        check_payload(_orders_spec(tmp_path), "shop", "/order", {"id": 0, "items": [{}], "x": 1})
    text = str(refused.value)
    assert "refused by backend shop's spec (POST /order)" in text
    assert "payload.id: 0 is less than the minimum of 1" in text
    assert "payload.items[0].sku is required" in text
    assert "payload.x is not a field of this route" in text


def test_integers_past_2_53_are_judged_exactly(tmp_path: Path) -> None:
    spec, base = _orders_spec(tmp_path), {"items": [{"sku": "s"}]}
    check_payload(spec, "shop", "/order", {**base, "id": BIG})
    for over in (BIG + 1, 2**64):
        with pytest.raises(InvalidJob, match="is greater than the maximum"):
            check_payload(spec, "shop", "/order", {**base, "id": over})
