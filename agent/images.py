"""The backend's image onto the machine's Docker engine, before the backend starts.

The join reply's ``backend.image_source`` (protocol.ImageSource) says where it comes from:

- ``source="registry", reference="HOST/NAME@sha256:...", auth=...``: pulled by the engine
  (``POST /images/create``), the credentials in ``X-Registry-Auth``.
- ``source="controller", reference="sha256:<image id>", name=...``: fetched from
  the controller (``GET /v1/machines/NAME/images/ID`` with the session) and streamed into
  ``POST /images/load`` as it arrives, never held whole; then the loaded image's id must be
  the one asked for (an image id is the digest of its config, which pins every layer's
  digest, and the engine checks each layer against it while loading).

An image the engine has already is not fetched again. Transient failures (the controller or
the registry unreachable, a 5xx, a stream cut short) are retried with backoff until the
deadline; a missing or unauthorised image fails at once. Either way the error names the image
and the agent reports a failed boot.

Errors (agent/errors.py): ImageError, a RuntimeError_ (the boot fails), and under it
ImageUnavailable (missing or unauthorised: retrying cannot help).
"""

from __future__ import annotations

import base64
import json
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any
from urllib.parse import quote

from agent.docker import API_VERSION, DockerAPI, _UnixConnection
from agent.errors import AgentError, DockerError, ImageError, ImageUnavailable
from agent.logs import Log
from agent.protocol import ImageSource

CHUNK_BYTES = 1 << 22
PROGRESS_EVERY_SECONDS = 2.0
READ_TIMEOUT_SECONDS = 60.0  # a stream silent this long is cut short, and retried
DENIED = ("unauthorized", "no basic auth credentials", "denied", "authentication required")


__all__ = ["ImageError", "ImageUnavailable", "Transient", "ensure_image"]


class Transient(AgentError):
    """Worth another try: what a ``fetch`` raises when the controller did not answer well."""


def ensure_image(
    api: DockerAPI,
    source: ImageSource,
    fetch: Callable[[str], Any],
    log: Log,
    deadline: float,
    sleep: Callable[[float], None] = time.sleep,
) -> str:
    """Make the image present on the engine; the reference to create containers from.

    ``fetch(image_id)`` opens the controller's stream of a served image: a ``requests``
    response (``stream=True``); it raises ImageUnavailable (never worth retrying) or
    Transient.
    """
    reference = source.reference
    if _present(api, reference):
        log("image_cached", image=reference)
        return reference
    started, attempt = time.monotonic(), 0
    log("image_fetch", image=reference, source=source.source)
    while True:
        try:
            if source.source == "registry":
                auth = source.auth.to_json() if source.auth else None
                _pull(api, reference, auth, log)
            else:
                _load(api, reference, source.name, fetch, log)
            log("image_ready", image=reference, seconds=f"{time.monotonic() - started:.1f}")
            return reference
        except ImageUnavailable:
            raise
        except (Transient, DockerError, OSError) as exc:
            pause = min(10.0, 0.5 * 2.0**attempt)
            if time.monotonic() + pause > deadline:
                raise ImageError(
                    f"image {reference} did not arrive before the boot timeout: {exc}"
                ) from exc
            log("image_retry", image=reference, reason=exc, wait=f"{pause:.1f}")
            sleep(pause)
            attempt += 1


def _present(api: DockerAPI, reference: str) -> bool:
    found = api.call("GET", f"/images/{quote(reference, safe='/:@')}/json", ok=(404,))
    return bool(found) and "Id" in found


def registry_auth_header(auth: dict[str, str] | None) -> dict[str, str]:
    if not auth:
        return {}
    return {"X-Registry-Auth": base64.urlsafe_b64encode(json.dumps(auth).encode()).decode()}


def _pull(api: DockerAPI, reference: str, auth: dict[str, str] | None, log: Log) -> None:
    path = f"/images/create?fromImage={quote(reference, safe='')}"
    progress = _Progress(log, reference)
    try:
        for line in _engine_stream(api, "POST", path, None, registry_auth_header(auth)):
            if line.get("error"):
                raise _classify(reference, 200, str(line["error"]))
            progress.pulled(line)
    except _EngineRefused as exc:
        raise _classify(reference, exc.status, exc.message) from exc
    if not _present(api, reference):
        raise Transient(f"the engine pulled {reference} but does not have it")


def _classify(reference: str, status: int, message: str) -> Exception:
    lowered = message.lower()
    if status == 404 or "manifest unknown" in lowered or "not found" in lowered:
        return ImageUnavailable(f"image {reference} is not in its registry: {message}")
    if any(word in lowered for word in DENIED):
        return ImageUnavailable(f"image {reference}: the registry refused the pull: {message}")
    return Transient(f"pulling {reference}: {status}: {message}")


def _load(
    api: DockerAPI, image_id: str, name: str | None, fetch: Callable[[str], Any], log: Log
) -> None:
    answer = fetch(image_id)
    progress = _Progress(log, image_id)
    try:
        body = progress.counted(answer.iter_content(CHUNK_BYTES))
        loaded = ""
        try:
            for line in _engine_stream(api, "POST", "/images/load?quiet=1", body, {}):
                if line.get("error"):
                    raise Transient(f"loading {image_id}: {line['error']}")
                text = str(line.get("stream", ""))
                if "Loaded image ID:" in text:
                    loaded = text.split("Loaded image ID:", 1)[1].strip()
        except _EngineRefused as exc:
            raise Transient(f"loading {image_id}: {exc.status}: {exc.message}") from exc
    finally:
        answer.close()
    if loaded != image_id or not _present(api, image_id):
        raise Transient(
            f"image {image_id} did not check out: the engine loaded {loaded or 'nothing'} "
            f"from {progress.received / 1e6:.1f} MB"
        )
    progress.done()
    if name:  # a name for people (docker images); the id is what runs
        api.call("POST", f"/images/{image_id}/tag?repo={quote(name)}&tag={image_id[7:19]}")


class _EngineRefused(AgentError):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"{status}: {message}")
        self.status, self.message = status, message


def _engine_stream(
    api: DockerAPI,
    method: str,
    path: str,
    body: Iterable[bytes] | None,
    headers: dict[str, str],
) -> Iterator[dict[str, Any]]:
    """One Engine API request whose body (chunked) and answer (JSON lines) both stream."""
    conn = _UnixConnection(api.socket_path, READ_TIMEOUT_SECONDS)
    try:
        if body is None:
            conn.request(method, f"/{API_VERSION}{path}", headers=headers)
        else:
            conn.request(
                method,
                f"/{API_VERSION}{path}",
                body=body,
                headers={**headers, "Content-Type": "application/x-tar"},
                encode_chunked=True,
            )
        answer = conn.getresponse()
        if answer.status >= 400:
            raw = answer.read()
            try:
                message = json.loads(raw).get("message", "")
            except ValueError:
                message = raw.decode(errors="replace")
            raise _EngineRefused(answer.status, message)
        for line in answer:
            if line.strip():
                yield json.loads(line)
    finally:
        conn.close()


class _Progress:
    """Logs how an image arrives, at most every PROGRESS_EVERY_SECONDS."""

    def __init__(self, log: Log, image: str) -> None:
        self.log, self.image = log, image
        self.started = self.last = time.monotonic()
        self.received = 0
        self.layers: dict[str, tuple[int, int]] = {}

    def _due(self) -> bool:
        now = time.monotonic()
        if now - self.last < PROGRESS_EVERY_SECONDS:
            return False
        self.last = now
        return True

    def counted(self, chunks: Iterable[bytes]) -> Iterator[bytes]:
        try:
            for chunk in chunks:
                self.received += len(chunk)
                if self._due():
                    self._report()
                yield chunk
        except Exception as exc:  # requests' own errors: the stream broke off
            raise Transient(f"the controller's stream of {self.image} broke off: {exc}") from exc

    def pulled(self, line: dict[str, Any]) -> None:
        detail = line.get("progressDetail") or {}
        if line.get("id") and detail.get("total"):
            self.layers[line["id"]] = (int(detail.get("current", 0)), int(detail["total"]))
        if self._due():
            current = sum(each[0] for each in self.layers.values())
            total = sum(each[1] for each in self.layers.values())
            self.log(
                "image_progress",
                image=self.image,
                status=line.get("status"),
                mb=f"{current / 1e6:.1f}/{total / 1e6:.1f}",
            )

    def _report(self) -> None:
        seconds = max(time.monotonic() - self.started, 1e-6)
        self.log(
            "image_progress",
            image=self.image,
            mb=f"{self.received / 1e6:.1f}",
            rate=f"{self.received / 1e6 / seconds:.1f}MB/s",
        )

    def done(self) -> None:
        self._report()
