"""The Pulumi program: pool configs -> firewalled machines whose cloud-init installs the agent.

Components take typed args and parent their children; none reads Pulumi config (only the
project's ``__main__.py`` does). The stack holds machine names, not counts
(``sp00ky:machines``), so scaling down removes exactly the machine the controller chose, and
each machine's own revision, so a machine draining after a deploy keeps the labels of what it
runs until it is destroyed. A pool whose ``machine.image`` is ``baked`` boots what the stack's
``sp00ky:images`` names for it (the controller's bake: its snapshot's label selector), or
the default image until it names one; a machine keeps the image it was created from
(infra/machine.py).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pulumi

from sp00ky_infra.config import Config, Pool
from sp00ky_infra.config.machine_images import BAKED
from sp00ky_infra.config.model import DEFAULT_MACHINE_IMAGE
from sp00ky_infra.infra.firewall import HetznerFirewall
from sp00ky_infra.infra.machine import HetznerMachine
from sp00ky_infra.shared import labels as label
from sp00ky_infra.shared import names
from sp00ky_infra.shared.cloud_init import user_data
from sp00ky_infra.shared.desired import Desired
from sp00ky_infra.shared.tokens import STACK_JOIN_TTL_SECONDS, issue_join_token

if TYPE_CHECKING:  # imported only where the stack's provider is docker: the Docker SDK and
    # what it pulls in (paramiko, cryptography) are slow to import, and a Hetzner stack needs none
    from sp00ky_infra.infra.container import DockerMachine, DockerNetwork


@dataclass(frozen=True, slots=True)
class PoolArgs:
    project: str
    pool: Pool
    backend: str
    revision: str  # what the pool's new machines run
    machines: Mapping[str, str | None]  # name -> the revision it runs (None: the pool's)
    pool_url: str
    pool_secret: str
    config_root: str = "."
    dockerfile: str | None = None
    extra_labels: Mapping[str, str] = field(default_factory=dict)
    image: str = DEFAULT_MACHINE_IMAGE  # what the pool's new machines boot (``boot_image``)


def boot_image(pool: Pool, images: Mapping[str, str]) -> str:
    """What a new machine of ``pool`` boots: its ``machine.image``, except that ``baked``
    is the image the stack names for the pool (``images``), the default until it names one."""
    if pool.machine.image != BAKED:
        return pool.machine.image
    return images.get(pool.name) or DEFAULT_MACHINE_IMAGE


def labels(args: PoolArgs, machine: str | None = None) -> dict[str, str]:
    """The labels every resource of a pool carries (shared/labels.py), plus the guardian's limit; a
    machine's carry its name and the revision it runs."""
    found = {
        label.PROJECT: args.project,
        label.POOL: args.pool.name,
        label.REVISION: args.revision,
        label.LIMIT: str(args.pool.limit),
        **args.extra_labels,
    }
    if machine is not None:
        found[label.MACHINE] = machine
        found[label.REVISION] = args.machines.get(machine) or args.revision
    return found


class HetznerPool(pulumi.ComponentResource):
    """A pool on Hetzner Cloud: a firewall with no inbound rules (outbound open), and one
    server per machine name, each with the firewall, the labels and its user-data."""

    def __init__(
        self, name: str, args: PoolArgs, opts: pulumi.ResourceOptions | None = None
    ) -> None:
        super().__init__("sp00ky:infra:HetznerPool", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        pool_labels = labels(args)
        pool_labels.pop(label.REVISION)
        # No rules at all: Hetzner then drops every inbound packet and lets all outbound go.
        self.firewall = HetznerFirewall(
            f"{name}-firewall",
            name=names.firewall_name(args.project, args.pool.name),
            labels=pool_labels,
            opts=child,
        )
        self.machines: dict[str, HetznerMachine] = {}
        for machine in args.machines:
            token = issue_join_token(args.pool_secret, machine, time.time(), STACK_JOIN_TTL_SECONDS)
            self.machines[machine] = HetznerMachine(
                machine,
                name=machine,
                server_type=args.pool.machine.type,
                fallback_types=list(args.pool.machine.fallback_types),
                locations=list(args.pool.machine.locations),
                image=args.image,
                labels=labels(args, machine),
                user_data=user_data(machine, args.pool_url, token, runtime="docker"),
                firewall_ids=[self.firewall.id],
                opts=child,
            )
        self.register_outputs(
            {
                "firewall_id": self.firewall.id,
                "servers": {m: r.id for m, r in self.machines.items()},
            }
        )


class DockerPool(pulumi.ComponentResource):
    """A pool on the local Docker engine: a machine container per name on the stack's
    network, each made by the dynamic provider over ``sp00ky_infra.engine`` (infra/container.py):
    ``sp00ky-dev-machine-<backend>`` (the backend's image from deploy.dockerfile, with the
    agent), running the agent, which reaches the controller at ``pool_url`` (on Linux, a
    controller on the host is ``host.docker.internal``, mapped to the host's gateway). The
    backend's port is never published."""

    def __init__(
        self,
        name: str,
        args: PoolArgs,
        network: DockerNetwork,
        opts: pulumi.ResourceOptions | None = None,
    ) -> None:
        from sp00ky_infra.infra.container import DockerMachine

        super().__init__("sp00ky:infra:DockerPool", name, None, opts)
        child = pulumi.ResourceOptions(parent=self)
        if not args.dockerfile:
            raise ValueError(f"pool {args.pool.name}: its backend has no deploy.dockerfile")
        dockerfile = Path(args.config_root, args.dockerfile).resolve()
        self.containers: dict[str, DockerMachine] = {}
        for machine in args.machines:
            token = issue_join_token(args.pool_secret, machine, time.time(), STACK_JOIN_TTL_SECONDS)
            self.containers[machine] = DockerMachine(
                machine,
                name=machine,
                project=args.project,
                backend=args.backend,
                dockerfile=str(dockerfile),
                context=str(dockerfile.parent),
                network=network.name,
                labels=labels(args, machine),
                controller_url=args.pool_url,
                join_token=token,
                opts=child,
            )
        self.register_outputs({"containers": {m: c.id for m, c in self.containers.items()}})


def build(
    config: Config,
    provider: str,
    machines: Desired | Mapping[str, Sequence[str]],
    pool_url: str,
    pool_secret: str,
    project: str,
    images: Mapping[str, str] | None = None,
) -> dict[str, pulumi.ComponentResource]:
    """One component per pool the stack serves (``served_pools``), with the machines the
    stack asks for; ``images``: what a ``baked`` pool's new machines boot, by pool
    (``sp00ky:images``)."""
    if not isinstance(machines, Desired):
        machines = Desired.parse(machines)
    served = served_pools(config, machines)
    network = None
    if provider == "docker":
        from sp00ky_infra.infra.container import DockerNetwork

        network = DockerNetwork("sp00ky-network", name=names.network_name(project), project=project)
    components: dict[str, pulumi.ComponentResource] = {}
    for name, pool in served.items():
        backend = config.backend_for(name)
        args = PoolArgs(
            project=project,
            pool=pool,
            backend=backend.name,
            revision=backend.revision(pool),
            machines=machines.of(name),
            pool_url=pool_url,
            pool_secret=pool_secret,
            config_root=config.root,
            dockerfile=backend.deploy.dockerfile,
            image=boot_image(pool, images or {}),
        )
        if network is not None:
            components[name] = DockerPool(name, args, network)
        else:
            components[name] = HetznerPool(name, args)
    return components


def served_pools(config: Config, machines: Desired) -> dict[str, Pool]:
    """The pools a stack serves: sp00ky.yml's hetzner pools (a stack whose sp00ky:provider is
    docker runs them on this host). Its docker pools are containers the controller makes on
    its own engine: the stack makes nothing for them, not even a firewall. ValueError when
    sp00ky:machines names a pool that is not the stack's."""
    served = {name: pool for name, pool in config.pools.items() if pool.provider == "hetzner"}
    unknown = sorted(set(machines.pools) - set(config.pools))
    if unknown:
        raise ValueError(
            f"sp00ky:machines names pools that sp00ky.yml does not declare: {', '.join(unknown)}"
        )
    elsewhere = sorted(set(machines.pools) - set(served))
    if elsewhere:
        raise ValueError(
            f"sp00ky:machines names pools that are not hetzner pools: {', '.join(elsewhere)} "
            "(the controller runs a docker pool's machines on its own Docker engine)"
        )
    return served
