"""Pulumi's dynamic-provider host (`python -m pulumi.dynamic`), started as the engine starts it:
from the project directory, in the project's virtual environment, with nothing added to
PYTHONPATH; reached over gRPC."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

import grpc
from pulumi.runtime.proto import provider_pb2_grpc

from tests.helpers import ROOT


@contextmanager
def dynamic_host(env: Mapping[str, str]) -> Iterator[provider_pb2_grpc.ResourceProviderStub]:
    """The host, with ``env`` added to this process's environment (PYTHONPATH dropped)."""
    full = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    full.update(env)
    proc = subprocess.Popen(
        [sys.executable, "-m", "pulumi.dynamic"], cwd=ROOT, env=full,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline().strip())
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        grpc.channel_ready_future(channel).result(timeout=30)
        yield provider_pb2_grpc.ResourceProviderStub(channel)
        channel.close()
    finally:
        proc.terminate()
        proc.wait(timeout=20)
