"""Schemathesis against both OpenAPI documents, as served by a real controller: requests made
from the schemas (valid ones and ones that break them), bounded per operation, and not one
answer may be a server error."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.core.result import Err

from sp00ky_infra.client import Client
from tests.controllers import (
    ADMIN_TOKEN,
    ControllerProcess,
    backend_app,
    project,
    running_controller,
    wait_for,
)

EXAMPLES = 15  # per operation and mode: about 1,000 requests in all, a few seconds


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ControllerProcess, str]]:
    """A controller, its pool paused (nothing boots), and a joined machine's session."""
    folder = tmp_path_factory.mktemp("schemathesis")
    store_url = f"sqlite:///{folder}/state.db"
    app = backend_app("render", "render_job", folder / "backend.jsonl")
    pools = {"render": {"min": 0, "autoscale": True, "max": 1}}
    config = project(folder, pools, {"renderer": app})
    with Client(store_url, config) as client, running_controller(folder, config, store_url) as c:
        wait_for(c.leader, what="leadership")
        assert c.admin("POST", "/pools/render/pause").status_code == 200
        yield c, c.join(client, "fuzz-m1")


def _operations(url: str, headers: dict[str, str]) -> list[Any]:
    document = requests.get(url, headers=headers, timeout=10)
    assert document.status_code == 200, document.text
    schema = schemathesis.openapi.from_dict(document.json())
    operations = []
    for result in schema.get_all_operations():
        if isinstance(result, Err):  # an operation schemathesis cannot read: say which
            raise AssertionError(f"{url}: {result.err()}")
        operations.append(result.ok())
    return operations


def _fuzz(operation: Any, base_url: str, headers: dict[str, str], **fixed: Any) -> list[str]:
    """Every server error ``operation`` answered, for valid and invalid requests alike."""
    errors: list[str] = []
    modes = st.sampled_from([GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
    strategies = {
        mode: operation.as_strategy(generation_mode=mode, path_parameters=fixed or None)
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE)
    }

    @settings(
        max_examples=2 * EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(data=st.data(), mode=modes)
    def run(data: st.DataObject, mode: GenerationMode) -> None:
        case = data.draw(strategies[mode])
        answer = case.call(base_url=base_url, headers=headers, timeout=15)
        if answer.status_code >= 500:
            errors.append(
                f"{case.method} {case.formatted_path} ({mode}): {answer.status_code} "
                f"{answer.text[:200]}; body {str(case.body)[:200]}"
            )

    run()
    return errors


def test_the_agents_endpoint_never_answers_a_server_error(
    served: tuple[ControllerProcess, str],
) -> None:
    controller, session = served
    operations = _operations(f"{controller.agents_url}/v1/openapi.json", {})
    assert len(operations) >= 7
    errors: list[str] = []
    for operation in operations:
        for headers in ({"Authorization": f"Bearer {session}"}, {}):
            errors += _fuzz(operation, controller.agents_url, headers)
        if "{name}" in operation.path:
            headers = {"Authorization": f"Bearer {session}"}
            errors += _fuzz(operation, controller.agents_url, headers, name="fuzz-m1")
    assert errors == []


def test_the_admin_api_never_answers_a_server_error(
    served: tuple[ControllerProcess, str], tmp_path: Path
) -> None:
    controller, _ = served
    headers = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    operations = _operations(f"{controller.admin_url}/openapi.json", headers)
    assert len(operations) >= 10
    errors: list[str] = []
    for operation in operations:
        errors += _fuzz(operation, controller.admin_url, headers)
        if "{name}" in operation.path and operation.path.startswith("/pools"):
            errors += _fuzz(operation, controller.admin_url, headers, name="render")
    assert errors == []
