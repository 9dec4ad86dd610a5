"""The local stack's Docker machine provider, serialized as Pulumi serializes it and driven
through the real provider host (`python -m pulumi.dynamic`) over gRPC, against the real Docker
engine: it builds the images it lacks and runs the machine container the controller would.

The host is started as the engine starts it: from the project directory, in the project's
virtual environment, with nothing added to PYTHONPATH.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import docker
import pytest
from google.protobuf import struct_pb2
from pulumi.dynamic.dynamic import serialize_provider
from pulumi.runtime.proto import provider_pb2, provider_pb2_grpc

from sp00ky_infra.infra.container import DockerMachineProvider, DockerNetworkProvider
from tests.conftest import BASE_IMAGE
from tests.dynamic_host import dynamic_host
from tests.helpers import ROOT

URN = "urn:pulumi:dev::shop::sp00ky:infra:DockerPool$pulumi-python:dynamic:Resource::render-a1"
NET_URN = "urn:pulumi:dev::shop::pulumi-python:dynamic:Resource::sp00ky-network"


@pytest.fixture
def host() -> Iterator[provider_pb2_grpc.ResourceProviderStub]:
    with dynamic_host({"PULUMI_PROJECT": "shop"}) as stub:
        yield stub


@pytest.fixture
def stack(tmp_path: Path, docker_images: str) -> Iterator[dict[str, Any]]:
    """A backend of the test's own (its images not built yet), a project and a network name."""
    name = f"t{secrets.token_hex(3)}"
    (tmp_path / "server.py").write_text((ROOT / "examples/backend/server.py").read_text())
    (tmp_path / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nCOPY server.py /app/server.py\nENV HOST=127.0.0.1\n"
        'CMD ["python3", "/app/server.py"]\n'
    )
    backend = f"be{name}"
    yield {
        "project": name,
        "backend": backend,
        "dockerfile": str(tmp_path / "Dockerfile"),
        "context": str(tmp_path),
        "network": f"sp00ky-{name}",
    }
    client = docker.from_env()
    for container in client.containers.list(all=True, filters={"label": f"sp00ky/project={name}"}):
        container.remove(force=True)
    for network in client.networks.list(names=[f"sp00ky-{name}"]):
        network.remove()
    for image in (f"sp00ky-dev-machine-{backend}", f"sp00ky-dev-pool-{backend}"):
        with contextlib.suppress(docker.errors.ImageNotFound):
            client.images.remove(image, force=True)
    client.close()


def _struct(values: dict[str, Any]) -> struct_pb2.Struct:
    struct = struct_pb2.Struct()
    struct.update(values)
    return struct


def _props(stack: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    props = {
        "__provider": serialize_provider(DockerMachineProvider()),
        "name": "render-a1",
        "project": stack["project"],
        "backend": stack["backend"],
        "dockerfile": stack["dockerfile"],
        "context": stack["context"],
        "network": stack["network"],
        "labels": {
            "sp00ky/project": stack["project"], "sp00ky/pool": "render",
            "sp00ky/machine": "render-a1", "sp00ky/revision": "r1", "sp00ky/limit": "2",
        },
        "controller_url": "http://host.docker.internal:8081",
        "join_token": "join-token-of-render-a1",
        "extra_hosts": {"host.docker.internal": "host-gateway"},
        "ports": [],
        "image": f"sp00ky-dev-machine-{stack['backend']}",
    }  # fmt: skip
    props.update(overrides)
    return props


def test_a_machine_container_is_made_with_the_machine_image_and_deleted_once(
    host: Any, stack: dict[str, Any]
) -> None:
    net = {
        "__provider": serialize_provider(DockerNetworkProvider()),
        "name": stack["network"],
        "project": stack["project"],
    }
    made = host.Create(provider_pb2.CreateRequest(urn=NET_URN, properties=_struct(net)), timeout=60)
    assert made.id
    created = host.Create(
        provider_pb2.CreateRequest(urn=URN, properties=_struct(_props(stack))), timeout=600
    )
    client = docker.from_env()
    try:
        container = client.containers.get(created.id)
        attrs = container.attrs
        assert attrs["Config"]["Image"] == f"sp00ky-dev-machine-{stack['backend']}"
        assert attrs["Config"]["Cmd"] == ["python3", "-m", "agent"]  # the agent is in the image
        env = dict(e.split("=", 1) for e in attrs["Config"]["Env"])
        assert env["SPKY_AGENT_JOIN_TOKEN"] == "join-token-of-render-a1"
        assert env["SPKY_AGENT_MACHINE"] == "render-a1"
        assert env["SPKY_AGENT_CONTROLLER_URL"] == "http://host.docker.internal:8081"
        assert env["SPKY_AGENT_COMMAND"] == '["python3", "/app/server.py"]'
        assert container.labels["sp00ky/machine"] == "render-a1"
        assert container.labels["sp00ky/role"] == "machine"
        assert container.labels["sp00ky/limit"] == "2"
        assert attrs["HostConfig"]["ExtraHosts"] == ["host.docker.internal:host-gateway"]
        assert attrs["HostConfig"]["PortBindings"] in ({}, None)
        assert list(attrs["NetworkSettings"]["Networks"]) == [stack["network"]]
        agent = client.images.get(f"sp00ky-dev-machine-{stack['backend']}")
        assert agent.labels["sp00ky/role"] == "machine-image"

        # A deploy (new labels, a fresh token) never replaces nor changes a container.
        olds = _struct({**_props(stack), "container_id": created.id})
        news = _struct(_props(stack, join_token="fresh", labels={"sp00ky/revision": "r2"}))
        diff = host.Diff(
            provider_pb2.DiffRequest(id=created.id, urn=URN, olds=olds, news=news), timeout=60
        )
        assert list(diff.replaces) == [] and diff.changes == provider_pb2.DiffResponse.DIFF_NONE

        delete = provider_pb2.DeleteRequest(id=created.id, urn=URN, properties=created.properties)
        host.Delete(delete, timeout=60)
        with pytest.raises(docker.errors.NotFound):
            client.containers.get(created.id)
        host.Delete(delete, timeout=60)  # already gone: done, not an error

        net_delete = provider_pb2.DeleteRequest(id=made.id, urn=NET_URN, properties=made.properties)
        host.Delete(net_delete, timeout=60)
        assert client.networks.list(names=[stack["network"]]) == []
    finally:
        client.close()
