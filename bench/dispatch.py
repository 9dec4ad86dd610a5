"""Dispatch benchmark: how fast a job reaches a machine, how many flow, how long a tick takes.

    .venv/bin/python bench/dispatch.py

1. latency from `run` (the row written) to the backend receiving the POST, on a warm machine
   (a real controller process, a real agent and the example backend on loopback);
   targets: p50 at most 50 ms, p99 at most 250 ms;
2. throughput of no-op jobs through 4 machines x 4 slots; target at least 200 jobs/s (SQLite);
3. the controller's tick with 20 pools, 200 machines and 100,000 pending jobs (in process,
   against a SQLite store, machines created by a provisioner that only records them);
   target at most 20 ms, flat in the number of pending jobs.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sp00ky_infra.client import Client
from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.provisioners import MachineSpec, Provisioned
from sp00ky_infra.controller.reconcile import tick
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.policy.machines import Reason
from sp00ky_infra.store import NewJob, open_store
from tests.controllers import backend_app, project, running_controller, wait_for


def succeeded(client: Client, job_id: str) -> bool:
    return client.store.get(job_id).status == "success"


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def latency(folder: Path, count: int) -> dict[str, float]:
    log = folder / "backend.jsonl"
    app = backend_app("render", "render_job", log)
    config = project(folder, {"render": {"min": 1, "recycle": "never"}}, {"renderer": app})
    store_url = f"sqlite:///{folder}/state.db"
    client = Client(store_url, config)
    samples = []
    with running_controller(folder, config, store_url, SPKY_TICK="2s"):
        wait_for(
            lambda: [m.state for m in client.store.machines.live("render")] == ["ready"], timeout=30
        )
        seen = 0
        for n in range(count + 5):
            sent = time.time()
            job = client.run("renderer", "/render", {"gameId": f"g{n}", "seconds": 0})
            while True:  # the backend's own log line says when the POST arrived
                lines = log.read_text().splitlines() if log.exists() else []
                starts = [json.loads(x) for x in lines[seen:] if '"start"' in x]
                if starts:
                    break
                time.sleep(0.0005)
            seen = len(lines)
            if n >= 5:  # the first few warm the connection pool and the caches
                samples.append((starts[0]["t"] - sent) * 1000)
            wait_for(functools.partial(succeeded, client, job.id), timeout=10, interval=0.001)
    client.close()
    return {
        "latency_p50_ms": statistics.median(samples),
        "latency_p99_ms": percentile(samples, 0.99),
        "latency_max_ms": max(samples),
    }


def throughput(folder: Path, count: int) -> dict[str, float]:
    app = backend_app("render", "render_job", folder / "unused.jsonl")
    del app["env"]["BACKEND_LOG"]
    pools = {"render": {"min": 4, "slots": 4, "recycle": "never"}}
    config = project(folder, pools, {"renderer": app})
    store_url = f"sqlite:///{folder}/state.db"
    store = open_store(store_url)
    with running_controller(folder, config, store_url, SPKY_TICK="2s"):
        wait_for(
            lambda: len([m for m in store.machines.live("render") if m.state == "ready"]) == 4,
            timeout=30,
        )
        news = [
            NewJob(
                "renderer",
                "render_job",
                "/render",
                {"gameId": f"t{n}", "seconds": 0},
                pool="render",
            )
            for n in range(count)
        ]
        started = time.perf_counter()
        store.enqueue_many(news, time.time())
        wait_for(lambda: store.counts()["success"] == count, timeout=600, interval=0.05)
        elapsed = time.perf_counter() - started
    store.close()
    return {"throughput_jobs_per_s": count / elapsed, "throughput_jobs": count}


class RecordingProvisioner:
    """Creates nothing: the tick benchmark measures the controller, not machines."""

    name = "bench"
    delivers_join_token = False

    def create(self, spec: MachineSpec) -> Provisioned:
        return Provisioned(provider_id=spec.name)

    def destroy(self, name: str, provider_id: str | None, provider_state: str | None) -> None:
        pass

    def close(self) -> None:
        pass


def tick_time(
    folder: Path, pending: int, pools: int = 20, machines_per_pool: int = 10
) -> dict[str, float]:
    names = [f"p{n:02d}" for n in range(pools)]
    log = folder / "unused.jsonl"
    config_path = project(
        folder,
        {name: {"min": 0, "autoscale": True, "max": machines_per_pool} for name in names},
        {f"{name}-app": backend_app(name, f"{name}_job", log) for name in names},
    )
    config = load_config(config_path)
    store = open_store(f"sqlite:///{folder}/state.db")
    settings = ControllerSettings(
        config_path=str(config_path), secret="bench", state_dir=str(folder)
    )
    controller = Controller(settings, config, store, RecordingProvisioner())
    now = time.time()
    for name in names:
        for n in range(machines_per_pool):
            machine = f"{name}-m{n}"
            store.machines.add(machine, name, "bench", controller.revisions[name], 1, now)
            store.machines.move(machine, Reason.PROVISIONED, now)
            store.machines.join(machine, f"session-of-{machine}", now)  # seen now
            store.machines.move(machine, Reason.READY, now)
        per_pool = pending // pools
        for start in range(0, per_pool, 5000):
            store.enqueue_many(
                [
                    NewJob(f"{name}-app", f"{name}_job", "/render", {"n": i}, pool=name)
                    for i in range(start, min(per_pool, start + 5000))
                ],
                now,
            )
    controller.prune.due(time.time() + 3600)  # retention is not what this measures
    tick(controller)  # leadership, idle clocks: once
    times = []
    for _ in range(30):
        started = time.perf_counter()
        report = tick(controller)
        times.append((time.perf_counter() - started) * 1000)
        assert report.leader and not any(plan.create or plan.drain for plan in report.plans)
    controller.leader_lock.release()
    store.close()
    return {"tick_p50_ms": statistics.median(times), "tick_max_ms": max(times)}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--latency-jobs", type=int, default=200)
    parser.add_argument("--throughput-jobs", type=int, default=3000)
    parser.add_argument("--pending", type=int, default=100_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    figures: dict[str, Any] = {}
    with tempfile.TemporaryDirectory() as folder:
        print("latency: one warm machine, jobs one after another ...", flush=True)
        figures.update(latency(Path(folder) / "latency", args.latency_jobs))
        print("throughput: 4 machines x 4 slots, no-op jobs ...", flush=True)
        figures.update(throughput(Path(folder) / "throughput", args.throughput_jobs))
        print("tick: 20 pools, 200 machines ...", flush=True)
        small = tick_time(Path(folder) / "tick-small", 1_000)
        large = tick_time(Path(folder) / "tick-large", args.pending)
        figures.update({f"{k}_1000_pending": v for k, v in small.items()})
        figures.update({f"{k}_{args.pending}_pending": v for k, v in large.items()})
    if args.json:
        print(json.dumps(figures, indent=2))
        return
    for name, value in figures.items():
        print(f"  {name:<36} {value:>10.2f}")
    checks = [
        ("latency p50 <= 50 ms", figures["latency_p50_ms"] <= 50),
        ("latency p99 <= 250 ms", figures["latency_p99_ms"] <= 250),
        ("throughput >= 200 jobs/s", figures["throughput_jobs_per_s"] >= 200),
        (
            f"tick <= 20 ms with {args.pending:,} pending",
            figures[f"tick_p50_ms_{args.pending}_pending"] <= 20,
        ),
    ]
    for what, ok in checks:
        print(f"  target {what}: {'met' if ok else 'MISSED'}")


if __name__ == "__main__":
    main()
