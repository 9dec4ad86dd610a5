"""The controller's image server, over a stand-in for its Docker client: each served image is
saved once, in the background; a machine that asks meanwhile waits for the file, and one that
asks after a failed save is sent the engine's own stream."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from docker.errors import APIError, ImageNotFound

from sp00ky_infra.controller.images import CHUNK_BYTES, ImageServer, UnknownImage

IMAGE = "sha256:" + "ab" * 32
CONTENT = b"layer" * (CHUNK_BYTES // 2)  # two and a half chunks


class Engine:
    """The Docker client's few calls the server makes: ``docker save`` (``api.get_image``),
    each one counted, held until ``release`` is set, failing while ``failures`` last."""

    def __init__(self, failures: int = 0) -> None:
        self.api, self.images = self, self
        self.saves = 0
        self.failures = failures
        self.release = threading.Event()
        self.release.set()

    def get_image(self, image_id: str, chunk_size: int) -> Iterator[bytes]:
        self.saves += 1
        failing = self.failures > 0
        self.failures -= 1
        return self._save(failing, chunk_size)

    def _save(self, failing: bool, chunk_size: int) -> Iterator[bytes]:
        assert self.release.wait(10)
        if failing:
            raise APIError("500 Server Error: the engine's save broke off")
        for at in range(0, len(CONTENT), chunk_size):
            yield CONTENT[at : at + chunk_size]

    def get(self, image_id: str) -> None:
        if image_id != IMAGE:
            raise ImageNotFound(f"No such image: {image_id}")

    def close(self) -> None:
        pass


def _server(engine: Engine, spool: Path) -> ImageServer:
    server = ImageServer(engine, spool=str(spool))  # type: ignore[arg-type]  # a stand-in
    return server


def test_machines_asking_during_the_save_wait_for_it_and_are_sent_the_file(
    tmp_path: Path,
) -> None:
    engine = Engine()
    engine.release.clear()
    server = _server(engine, tmp_path)
    server.serve(IMAGE)
    got: list[bytes] = []
    asking = [threading.Thread(target=lambda: got.append(b"".join(server.stream(IMAGE))))
              for _ in range(2)]  # fmt: skip
    for each in asking:
        each.start()
    asking[0].join(0.3)
    assert got == [] and asking[0].is_alive()  # the save is under way: they wait
    engine.release.set()
    for each in asking:
        each.join(10)
    assert got == [CONTENT, CONTENT] and engine.saves == 1
    assert all(len(chunk) <= CHUNK_BYTES for chunk in server.stream(IMAGE))
    server.close()
    assert list(tmp_path.iterdir()) == []


def test_after_a_failed_save_a_machine_is_sent_the_engines_own_stream(tmp_path: Path) -> None:
    engine = Engine(failures=1)
    server = _server(engine, tmp_path)
    server.serve(IMAGE)
    assert b"".join(server.stream(IMAGE)) == CONTENT
    assert engine.saves == 2  # the failed save, then the machine's own
    (spool,) = tmp_path.iterdir()
    assert list(spool.iterdir()) == []  # nothing half-saved is left to be sent
    server.close()


def test_an_image_not_served_or_lost_by_the_engine_is_refused_at_once(tmp_path: Path) -> None:
    engine = Engine(failures=1)
    server = _server(engine, tmp_path)
    with pytest.raises(UnknownImage, match="is not one this controller serves"):
        server.stream(IMAGE)
    lost = server.serve("sha256:" + "cd" * 32)
    with pytest.raises(UnknownImage, match="is no longer on the controller's engine"):
        server.stream(lost)
    assert engine.saves == 1  # its save only; nothing was streamed
    server.close()
