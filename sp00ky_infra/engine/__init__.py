"""The Docker Engine work both the controller (its docker provisioner, its image server) and
infra (the local Pulumi stack's dynamic provider) do: the images (``images``), the network
(``network``) and the machine containers (``machines``), with the engine to speak to
(``client``) and the progress of builds and pulls (``progress``). Below both of them
(``.importlinter``); named ``engine``, not ``docker``, so it never shadows the SDK.

Docker's own errors (DockerException and its kinds) are the callers' to word, except
``connect`` and ``ipv4_pool``, which raise EngineError, and a build whose Dockerfile is not
there (MissingDockerfile, a DockerException), which names the path and the setting to fix.
"""

from sp00ky_infra.engine.client import EngineError, connect
from sp00ky_infra.engine.images import (
    MissingDockerfile,
    build_images,
    build_machine_image,
    build_pool_image,
    image_command,
    pull_images,
)
from sp00ky_infra.engine.machines import (
    HOST_GATEWAY,
    MachineRun,
    machine_containers,
    remove_container,
    run_machine,
)
from sp00ky_infra.engine.network import (
    ensure_network,
    ipv4_pool,
    made_network,
    network_gateway,
    remove_network,
    remove_unused_network,
)
from sp00ky_infra.engine.progress import Reporter, reporting

__all__ = [
    "HOST_GATEWAY",
    "EngineError",
    "MachineRun",
    "MissingDockerfile",
    "Reporter",
    "build_images",
    "build_machine_image",
    "build_pool_image",
    "connect",
    "ensure_network",
    "image_command",
    "ipv4_pool",
    "machine_containers",
    "made_network",
    "network_gateway",
    "pull_images",
    "remove_container",
    "remove_network",
    "remove_unused_network",
    "reporting",
    "run_machine",
]
