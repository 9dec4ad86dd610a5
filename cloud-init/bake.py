"""A bake server's one boot: run by cloud-init from the bake's user-data
(``python3 bake.py SHA256``), which carries this file and ``/etc/sp00ky/bake.json``: where
the baking host's feed is, its tokens, and the backend's image (where it comes from). The
standard library until the agent is unpacked; then the agent's own image code fetches the
image.

It fetches the agent archive from the feed (``GET /agent``, a one-time token), checks it
against SHA256 before any of it is unpacked, unpacks it into /opt/sp00ky with that sha256
beside it (``SHA256_FILE``: a machine booted from the snapshot finds its agent there and
fetches none), installs Docker and python3-requests where missing and the agent's unit
without enabling it (a machine booted from the snapshot joins through its own user-data),
starts Docker, brings the backend's image onto the engine as a joined agent would
(``agent/images.py``: pulled by digest, or fetched and loaded by id, checked either way; a
machine's agent then finds it there, ``image_cached``), then removes what was this boot's
alone (the bake's settings, cloud-init's instance state and logs, the machine-id) and powers
the server off: the bake, watching the server, snapshots it then. A failure is reported to
the feed (``POST /failed``) and leaves the server running, its reason on stdout
(cloud-init's output log).
"""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

HOME = Path("/opt/sp00ky")
SETTINGS = Path("/etc/sp00ky/bake.json")
SHA256_FILE = "agent.sha256"  # as agent/bootstrap.py reads it
IMAGE_SECONDS = 1800.0
FETCH_TRIES = 6  # the agent archive: about a minute of backoff while the feed is unreachable


def log(event: str, **fields: object) -> None:
    extra = " ".join(f"{key}={value}" for key, value in fields.items())
    print(f"sp00ky-bake event={event} {extra}".rstrip(), flush=True)


def run(*command: str) -> None:
    log("run", command=" ".join(command))
    subprocess.run(command, check=True)


def fetch_agent(settings: dict[str, Any]) -> bytes:
    """The agent archive from the feed; a refusal (4xx: the token spent) is final."""
    request = urllib.request.Request(
        f"{settings['url']}/agent", headers={"Authorization": f"Bearer {settings['agent_token']}"}
    )
    for attempt in range(FETCH_TRIES):
        try:
            with urllib.request.urlopen(request, timeout=60) as answer:
                archive: bytes = answer.read()
                return archive
        except urllib.error.HTTPError as exc:
            if exc.code < 500:
                raise
            problem: Exception = exc
        except OSError as exc:
            problem = exc
        log("retry", url=request.full_url, reason=problem)
        time.sleep(2.0**attempt)
    raise OSError(f"{request.full_url}: no answer after {FETCH_TRIES} tries ({problem})")


def install(expected: str, settings: dict[str, Any]) -> None:
    """The agent archive fetched, checked and unpacked, Docker and requests there, Docker
    running."""
    archive = fetch_agent(settings)
    actual = hashlib.sha256(archive).hexdigest()
    if actual != expected:
        raise OSError(f"the agent archive has sha256 {actual}, the bake expects {expected}")
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:bz2") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extraction_filter = tarfile.data_filter
        tar.extractall(HOME)
    (HOME / SHA256_FILE).write_text(actual + "\n")
    log("agent_fetched", sha256=actual)
    missing = []
    if subprocess.call(["sh", "-c", "command -v docker"], stdout=subprocess.DEVNULL):
        missing.append("docker.io")
    if subprocess.call(["python3", "-c", "import requests"], stderr=subprocess.DEVNULL):
        missing.append("python3-requests")
    if missing:
        run("apt-get", "update", "-q")
        run("apt-get", "install", "-y", "-q", *missing)
    unit = Path("/etc/systemd/system/sp00ky-agent.service")
    unit.write_bytes((HOME / "sp00ky-agent.service").read_bytes())
    run("systemctl", "daemon-reload")
    run("systemctl", "enable", "--now", "docker.service")


def fetch_image(settings: dict[str, Any]) -> None:
    """The backend's image onto the engine with the agent's own code (``ensure_image``)."""
    sys.path.insert(0, str(HOME))
    import requests

    from agent.docker import DockerAPI
    from agent.images import Transient, ensure_image
    from agent.protocol import ImageSource

    source = ImageSource.from_json(settings["image"])
    url, token = settings.get("url"), settings.get("token")

    def fetch(image_id: str) -> requests.Response:
        try:
            answer = requests.get(
                f"{url}/images/{image_id}", headers={"Authorization": f"Bearer {token}"},
                stream=True, timeout=60,
            )  # fmt: skip
        except requests.RequestException as exc:
            raise Transient(f"{url}: {exc}") from exc
        if answer.status_code != 200:
            raise Transient(f"{url}: HTTP {answer.status_code}")
        return answer

    def image_log(event: str, **fields: object) -> None:
        log(event, **{k: v for k, v in fields.items() if v is not None})

    ensure_image(DockerAPI(), source, fetch, image_log, time.monotonic() + IMAGE_SECONDS)


def report(settings: dict[str, Any], reason: str) -> None:
    """Tell the feed the bake failed, so the bake stops waiting; best effort."""
    request = urllib.request.Request(
        f"{settings['url']}/failed", json.dumps({"reason": reason}).encode(),
        {"Authorization": f"Bearer {settings['token']}", "Content-Type": "application/json"},
    )  # fmt: skip
    try:
        urllib.request.urlopen(request, timeout=30).close()
    except OSError as exc:
        log("unreported", reason=exc)


def main(expected: str) -> int:
    settings: dict[str, Any] = {}
    try:
        settings = json.loads(SETTINGS.read_text())
        install(expected, settings)
        fetch_image(settings)
    except Exception as exc:  # the bake's end: its reason on the console, the server left on
        log("failed", reason=exc)
        if settings.get("url"):
            report(settings, str(exc))
        return 1
    for path in (SETTINGS, Path(__file__)):
        path.unlink(missing_ok=True)
    run("cloud-init", "clean", "--logs")
    Path("/etc/machine-id").write_text("")  # made anew at each server's first boot
    log("baked")
    run("systemctl", "poweroff")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
