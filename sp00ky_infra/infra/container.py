"""A pool machine (and the stack's network) on the local Docker engine, as Pulumi
dynamic-provider resources over ``sp00ky_infra.engine`` (what the controller's docker
provisioner uses too); no pulumi_docker, whose bridged plugin must be downloaded.

The providers are serialized into the stack and run by the engine's provider host in another
process, so they keep no client: each method connects to the engine at DOCKER_HOST (default:
the local socket) at run time. They live in an importable module, so the serialized provider
refers to it by name and the host imports it from the project's venv.

create builds the backend's images if the engine lacks them (``sp00ky-dev-pool-<backend>``
from deploy.dockerfile, ``sp00ky-dev-machine-<backend>`` with the agent), makes the network if
missing, and runs the machine container: the machine image, the agent's environment with its
join token, the labels, no published port, ``host.docker.internal`` = the host's gateway.
delete treats "not found" as done. A machine is never replaced: a deploy is new machines under
new names, made and drained by the controller; and a container's labels cannot change, so no
change of inputs (a fresh join token, new labels) touches an existing container.
"""

from __future__ import annotations

from typing import Any

import pulumi
from pulumi.dynamic import CreateResult, DiffResult, ReadResult, Resource, ResourceProvider

from sp00ky_infra import engine
from sp00ky_infra.shared import labels as label
from sp00ky_infra.shared import names


class DockerMachineProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        client = engine.connect()
        try:
            engine.ensure_network(client, props["network"], props["project"])
            command = engine.build_images(
                client, props["project"], props["backend"], props["dockerfile"],
                props["context"], if_missing=True,
            )  # fmt: skip
            given = dict(props.get("labels") or {})
            run = engine.MachineRun(
                project=props["project"], pool=given.get(label.POOL, ""),
                machine=props["name"], revision=given.get(label.REVISION, ""),
                backend=props["backend"], controller_url=props["controller_url"],
                join_token=props["join_token"], command=command, network=props["network"],
                extra_labels=given,
            )  # fmt: skip
            container_id = engine.run_machine(client, run)
        finally:
            client.close()
        outs = {**props, "container_id": container_id, "image": run.image, "command": command}
        return CreateResult(id_=container_id, outs=outs)

    def delete(self, id: str, props: dict[str, Any]) -> None:
        client = engine.connect()
        try:
            engine.remove_container(client, id)
        finally:
            client.close()

    def diff(self, id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        """Never a replacement, never an update: a container runs what it was made with."""
        return DiffResult(changes=False, replaces=[], delete_before_replace=False)

    def read(self, id: str, props: dict[str, Any]) -> ReadResult:
        client = engine.connect()
        try:
            found = {c.id for c in engine.machine_containers(client, props.get("project", ""))}
        finally:
            client.close()
        if id not in found:
            return ReadResult(id_="", outs={})
        return ReadResult(id_=id, outs=props)


class DockerNetworkProvider(ResourceProvider):
    def create(self, props: dict[str, Any]) -> CreateResult:
        client = engine.connect()
        try:
            network_id = engine.ensure_network(client, props["name"], props["project"])
        finally:
            client.close()
        return CreateResult(id_=network_id, outs={**props, "network_id": network_id})

    def delete(self, id: str, props: dict[str, Any]) -> None:
        client = engine.connect()
        try:
            engine.remove_network(client, props["name"])
        finally:
            client.close()

    def diff(self, id: str, olds: dict[str, Any], news: dict[str, Any]) -> DiffResult:
        renamed = olds.get("name") != news.get("name")
        return DiffResult(
            changes=renamed, replaces=["name"] if renamed else [], delete_before_replace=True
        )


class DockerNetwork(Resource):
    """The bridge network of a project's machine containers."""

    name: pulumi.Output[str]

    def __init__(
        self, resource_name: str, *, name: str, project: str,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:  # fmt: skip
        super().__init__(
            DockerNetworkProvider(),
            resource_name,
            {"name": name, "project": project, "network_id": None},
            opts,
        )


class DockerMachine(Resource):
    """One pool machine: a container of ``sp00ky-dev-machine-<backend>`` running the agent."""

    container_id: pulumi.Output[str]
    image: pulumi.Output[str]

    def __init__(
        self,
        resource_name: str,
        *,
        name: str,
        project: str,
        backend: str,
        dockerfile: str,
        context: str,
        network: pulumi.Input[str],
        labels: dict[str, str],
        controller_url: str,
        join_token: pulumi.Input[str],
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        super().__init__(
            DockerMachineProvider(),
            resource_name,
            {
                "name": name,
                "project": project,
                "backend": backend,
                "dockerfile": dockerfile,
                "context": context,
                "network": network,
                "labels": labels,
                "controller_url": controller_url,
                "join_token": pulumi.Output.secret(join_token),
                "extra_hosts": dict(engine.HOST_GATEWAY),
                "ports": [],  # the backend's port is never published
                "image": names.machine_image(backend),
                "container_id": None,
                "command": None,
            },
            opts,
        )
