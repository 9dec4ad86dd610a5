"""`pulumi up`'s per-resource progress, forwarded: the provisioner hands
the Automation API an ``on_event`` and tells each resource step as it starts and ends."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest
from pulumi.automation import events

from sp00ky_infra.controller.provisioners.base import MachineSpec
from sp00ky_infra.controller.provisioners.pulumi import PulumiProvisioner, UpProgress
from tests.controllers import wait_for

MACHINE = "pulumi-python:dynamic:Resource"
URN = "urn:pulumi:prod::sp00ky::sp00ky:pool${}::{}"


def _step(op: str, name: str, kind: str = MACHINE) -> events.StepEventMetadata:
    return events.StepEventMetadata(
        op=events.OpType(op), urn=URN.format(kind, name), type=kind, provider=""
    )


def _pre(op: str, name: str, at: int, planning: bool = False) -> events.EngineEvent:
    meta = _step(op, name)
    return events.EngineEvent(0, at, resource_pre_event=events.ResourcePreEvent(meta, planning))


def _done(op: str, name: str, at: int) -> events.EngineEvent:
    return events.EngineEvent(0, at, res_outputs_event=events.ResOutputsEvent(_step(op, name)))


def _failed(op: str, name: str, at: int) -> events.EngineEvent:
    failed = events.ResOpFailedEvent(_step(op, name), status=1, steps=1)
    return events.EngineEvent(0, at, res_op_failed_event=failed)


def test_each_step_is_told_when_it_starts_and_how_it_ended() -> None:
    told: list[str] = []
    steps = UpProgress(told.append)
    for event in (
        _pre("same", "render-firewall", 100),  # unchanged: quiet
        _done("same", "render-firewall", 100),
        _pre("create", "render-3f2a1c", 100, planning=True),  # the preview's plan: quiet
        _pre("create", "render-3f2a1c", 101),
        _pre("delete", "render-0a0b0c", 102),
        _done("delete", "render-0a0b0c", 110),
        _done("create", "render-3f2a1c", 142),
        _pre("create", "render-9d9d9d", 143),
        _failed("create", "render-9d9d9d", 150),
        events.EngineEvent(0, 151, stdout_event=events.StdoutEngineEvent("text", "white")),
    ):
        steps.event(event)
    assert told == [
        "create render-3f2a1c ...",
        "delete render-0a0b0c ...",
        "render-0a0b0c deleted in 8s",
        "render-3f2a1c created in 41s",
        "create render-9d9d9d ...",
        "render-9d9d9d create failed in 7s",
    ]


def test_a_malformed_event_never_fails_the_update() -> None:
    told: list[str] = []
    UpProgress(told.append).event(object())
    UpProgress(told.append).event(events.EngineEvent(0, 1, resource_pre_event=None))
    assert told == []


class StackWithEvents:
    """A stack whose update reports its steps through ``on_event`` as the engine does."""

    def __init__(self) -> None:
        self.machines: dict[str, Any] = {}

    def get_all_config(self) -> dict[str, Any]:
        return {}

    def set_config(self, key: str, value: Any, *, path: bool = False) -> None:
        if key == "sp00ky:machines":
            self.machines = json.loads(value.value)

    def up(self, *, on_output: Any = None, on_event: Any = None) -> Any:
        assert on_event is not None, "the provisioner forwards the engine's events"
        for names in self.machines.values():
            for name in names:
                on_event(_pre("create", name, 10))
                on_event(_done("create", name, 52))
        return None

    def outputs(self) -> dict[str, Any]:
        return {"machines": {n: f"srv-{n}" for names in self.machines.values() for n in names}}


def test_the_provisioner_logs_each_step_of_its_update(caplog: pytest.LogCaptureFixture) -> None:
    provisioner = PulumiProvisioner(StackWithEvents)
    caplog.set_level(logging.INFO, logger="sp00ky.controller")
    try:
        spec = MachineSpec("render-3f2a1c", "render", "renderer", "r1", "https://p", "token")
        provisioner.create(spec)
        wait_for(lambda: provisioner.outcomes() or None, what="the update's outcome")
    finally:
        provisioner.close()
    assert list(provisioner.progress) == [
        "create render-3f2a1c ...",
        "render-3f2a1c created in 42s",
    ]
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("pulumi up: ")]
    assert logged == [f"pulumi up: {line}" for line in provisioner.progress]
