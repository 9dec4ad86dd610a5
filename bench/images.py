"""Image benchmark: how fast a machine receives a 200 MB image from its controller.

    .venv/bin/python bench/images.py [--mb 200]

Both figures come from the same run and the same image (FROM scratch plus MB of random
bytes, so nothing compresses), each into a fresh, empty second Docker engine on this host:

1. raw: ``docker save IMAGE | docker load`` (the host's engine into the second one);
2. controller: a real controller process builds the image from its Dockerfile and serves it
   over the agents' endpoint on loopback; a machine joins (a real join token and session) and
   the agent's own code streams it into the second engine's ``/images/load`` and checks its
   id. Neither side's peak memory grows by anything like the image: it is never held whole.

Prints MB/s for each (MB: the bytes of the ``docker save`` tar) and their ratio.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from record import record

from agent import controller as remote
from agent.docker import DockerAPI
from agent.images import ensure_image
from sp00ky_infra.client import Client
from sp00ky_infra.shared import tokens
from tests.controllers import SECRET, backend_app, project, running_controller
from tests.engines import second_engine

IMAGE = "sp00ky-bench/image"


def build(folder: Path, mb: int) -> Path:
    """The bench image's Dockerfile (and its context): one layer of ``mb`` random MB."""
    context = folder / "image"
    context.mkdir()
    with open(context / "blob", "wb") as out:
        for _ in range(mb):
            out.write(os.urandom(1 << 20))
    (context / "Dockerfile").write_text('FROM scratch\nCOPY blob /blob\nCMD ["/blob"]\n')
    subprocess.run(
        ["docker", "build", "-q", "-t", f"{IMAGE}:{mb}", str(context)],
        check=True, capture_output=True,
    )  # fmt: skip
    return context / "Dockerfile"


def raw(mb: int) -> tuple[int, float]:
    """docker save | docker load into an empty engine: (tar bytes, seconds)."""
    with second_engine() as engine:
        started = time.monotonic()
        save = subprocess.Popen(["docker", "save", f"{IMAGE}:{mb}"], stdout=subprocess.PIPE)
        load = subprocess.Popen(
            ["docker", "load", "-q"],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            env={**os.environ, "DOCKER_HOST": engine.host},
        )
        assert save.stdout is not None and load.stdin is not None
        size = 0
        while chunk := save.stdout.read(1 << 20):
            size += len(chunk)
            load.stdin.write(chunk)
        load.stdin.close()
        assert save.wait() == 0 and load.wait() == 0
        return size, time.monotonic() - started


def via_controller(folder: Path, dockerfile: Path) -> tuple[int, float, float, float]:
    """The controller's route into an empty engine: (tar bytes, seconds, and how much the
    agent's and the controller's peak memory grew, MB)."""
    app = backend_app("bench", "bench_job", folder / "backend.jsonl")
    app["deploy"]["dockerfile"] = str(dockerfile)
    config = project(folder, {"bench": {"min": 0, "autoscale": True, "max": 1}}, {"b": app})
    store_url = f"sqlite:///{folder}/state.db"
    client = Client(store_url, config)
    with (
        running_controller(
            folder, config, store_url, SPKY_POOL_IMAGES="1", SPKY_POOL_MAX_MACHINES="1"
        ) as controller,
        second_engine() as engine,
    ):
        # a machine row by hand (the cap keeps the controller's own out): it only fetches
        client.store.machines.add("bench-m1", "bench", "local", "bench", 1, time.time())
        agent = remote.Controller(controller.agents_url, "bench-m1")
        joined = agent.join(tokens.issue_join_token(SECRET, "bench-m1", time.time()))
        source = joined.backend.image_source
        assert source is not None and source.source == "controller"
        counted = Counted(agent)
        assert controller.proc is not None
        served_before = peak_mb(controller.proc.pid)
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        started = time.monotonic()
        ensure_image(DockerAPI(engine.socket), source, counted.fetch, lambda *_, **__: None, 1e12)
        seconds = time.monotonic() - started
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        served = peak_mb(controller.proc.pid) - served_before
    client.close()
    return counted.received, seconds, max(peak - before, 0) / 1024, served


def peak_mb(pid: int) -> float:
    """A process's peak resident memory (VmHWM), in MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


class Counted:
    """The agent's fetch, counting the bytes that arrive."""

    def __init__(self, agent: remote.Controller) -> None:
        self.agent = agent
        self.received = 0

    def fetch(self, image_id: str) -> Counted:
        self.answer = self.agent.image(image_id)
        return self

    def iter_content(self, size: int) -> Iterator[bytes]:
        for chunk in self.answer.iter_content(size):
            self.received += len(chunk)
            yield chunk

    def close(self) -> None:
        self.answer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="spky-bench-") as temp:
        folder = Path(temp)
        dockerfile = build(folder, args.mb)
        try:
            size, seconds = raw(args.mb)
            print(
                f"raw docker save | docker load : {size / 1e6:7.1f} MB in {seconds:6.2f} s "
                f"= {size / 1e6 / seconds:6.1f} MB/s"
            )
            got, took, peak, served = via_controller(folder / "controller", dockerfile)
            print(
                f"controller -> machine (HTTP)  : {got / 1e6:7.1f} MB in {took:6.2f} s "
                f"= {got / 1e6 / took:6.1f} MB/s"
            )
            print(
                f"peak memory grew by           : agent {peak:.0f} MB, controller {served:.0f} MB"
            )
            print(f"ratio controller / raw        : {(got / took) / (size / seconds):.2f}")
            record(
                "images",
                {
                    "raw_mb_per_s": size / 1e6 / seconds,
                    "controller_mb_per_s": got / 1e6 / took,
                    "ratio_controller_to_raw": (got / took) / (size / seconds),
                    "agent_peak_growth_mb": peak,
                    "controller_peak_growth_mb": served,
                },
            )
        finally:
            subprocess.run(["docker", "rmi", "-f", f"{IMAGE}:{args.mb}"], capture_output=True)
            subprocess.run(["docker", "rmi", "-f", "sp00ky-dev-pool-b"], capture_output=True)


if __name__ == "__main__":
    main()
