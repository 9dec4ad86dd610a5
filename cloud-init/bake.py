"""A bake server's one boot: run by cloud-init from the bake's user-data
(``python3 bake.py SHA256``), which carries this file, the agent archive and
``/etc/sp00ky/bake.json`` (the backend's image: where it comes from). The standard library
until the agent is unpacked; then the agent's own image code fetches the image.

It checks the archive against SHA256, unpacks it into /opt/sp00ky, installs Docker and
python3-requests where missing and the agent's unit without enabling it (a machine booted
from the snapshot joins through its own user-data), starts Docker, brings the backend's image
onto the engine as a joined agent would (``agent/images.py``: pulled by digest, or fetched
and loaded by id, checked either way), then removes what was this boot's alone (the bake's
settings, cloud-init's instance state and logs, the machine-id) and powers the server off:
the bake, watching the server, snapshots it then. A failure leaves it running, its reason on
stdout (cloud-init's output log), and the bake gives up at its timeout.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tarfile
import time
from pathlib import Path

HOME = Path("/opt/sp00ky")
SETTINGS = Path("/etc/sp00ky/bake.json")
ARCHIVE = HOME / "agent.tar.bz2"
IMAGE_SECONDS = 1800.0


def log(event: str, **fields: object) -> None:
    extra = " ".join(f"{key}={value}" for key, value in fields.items())
    print(f"sp00ky-bake event={event} {extra}".rstrip(), flush=True)


def run(*command: str) -> None:
    log("run", command=" ".join(command))
    subprocess.run(command, check=True)


def install(expected: str) -> None:
    """The agent archive checked and unpacked, Docker and requests there, Docker running."""
    actual = hashlib.sha256(ARCHIVE.read_bytes()).hexdigest()
    if actual != expected:
        raise OSError(f"the agent archive has sha256 {actual}, the bake expects {expected}")
    with tarfile.open(ARCHIVE, mode="r:bz2") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extraction_filter = tarfile.data_filter
        tar.extractall(HOME)
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


def fetch_image(settings: dict[str, object]) -> None:
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
                f"{url}/{image_id}", headers={"Authorization": f"Bearer {token}"},
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


def main(expected: str) -> int:
    try:
        settings = json.loads(SETTINGS.read_text())
        install(expected)
        fetch_image(settings)
    except Exception as exc:  # the bake's end: its reason on the console, the server left on
        log("failed", reason=exc)
        return 1
    for path in (SETTINGS, ARCHIVE, Path(__file__)):
        path.unlink(missing_ok=True)
    run("cloud-init", "clean", "--logs")
    Path("/etc/machine-id").write_text("")  # made anew at each server's first boot
    log("baked")
    run("systemctl", "poweroff")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
