"""What a ``pulumi up`` of a scale event spends, on the real engine (scripts/pulumi-engine)
against the fake Hetzner API: the counts the hour of test_api_budget.py is made of."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from sp00ky_infra.rehearse.cloud import FakeHetzner
from tests.hetzner.api_hour import MACHINES, a_stack, measured_ups


def test_a_scale_event_of_a_stack_of_50_machines_is_one_request_and_a_refresh_two(
    tmp_path: Path, pulumi_bin: str
) -> None:
    with FakeHetzner() as cloud:
        stack, revision = a_stack(tmp_path, pulumi_bin, cloud)
        spent = measured_ups(stack, cloud, revision)
        # no per-machine read: the engine asks the provider only of the machine that changes,
        # and a refresh reads every machine from one listing (and the pool's firewall by id)
        assert spent == {
            "scale_up": [Counter({"POST /servers": 1})],
            "scale_down": [Counter({"DELETE /servers/{id}": 1})],
            "unchanged": [Counter()],
            "refresh": [Counter({"GET /servers": 1, "GET /firewalls/{id}": 1})],
        }
        assert len(cloud.servers) == MACHINES
