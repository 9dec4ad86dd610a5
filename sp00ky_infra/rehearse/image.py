"""The rehearsal's machine image: what a Hetzner ``debian-12`` server boots, as a Docker image.

Debian bookworm made with ``debootstrap`` from Debian's mirror (no image registry is needed or
reached), with what matters of Hetzner's image for a pool machine: systemd as init, cloud-init,
python3 and python3-requests, Docker (``docker.io``: an engine of the machine's own),
ca-certificates, iproute2, OpenSSH, sudo, curl and locales. Then ``docker import`` with
``/sbin/init`` as its command, ``container=docker`` (systemd's own way to learn it runs in a
container) and a volume at ``/var/lib/docker`` (the inner engine's storage: on the host's
ext4 rather than the container's overlay, so overlay2 works inside instead of the slow vfs).
The locale cloud-init asks for (en_US.UTF-8) is generated, as a cloud image has it. Docker
cannot set a stop signal on import: the containers get SIGRTMIN+3 when made (``boot.py``).

The tag is a hash of the recipe (suite, packages, the files written, the import changes), so
an image is built once per machine and rebuilt only when the recipe changes. ``ensure_image``
is idempotent and prints its progress.

Two variants, each tagged by its own hash: with Docker (what Hetzner's ``docker-ce`` app image
has, the default) and without (``--without-docker``: what a system image such as
``debian-12`` has, where install-agent.sh installs docker.io at boot).

What differs from Hetzner's image, on purpose: cloud-init reads the NoCloud seed instead of
Hetzner's metadata service; it writes no network configuration (Docker gives the address, as
Hetzner's DHCP would) and keeps the hostname Docker set (the server's name, which Hetzner's
metadata would set: Docker's ``/etc/hostname`` is a bind mount that hostnamectl cannot
replace). The machine-id and the SSH host keys are left out, so each server makes its own on
its first boot, as on Hetzner.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from sp00ky_infra.rehearse.errors import ImageBuildError

DEFAULT_MIRROR = "http://deb.debian.org/debian"  # DEBIAN_MIRROR overrides it
REPOSITORY = "sp00ky-rehearse/debian-12"
ROLE_LABEL = "sp00ky-rehearse/role"
Progress = Callable[[str], None]
DOCKER_PACKAGES = ("docker.io",)  # what the variant without Docker leaves out

CLOUD_CFG = """\
# sp00ky rehearsal: a Docker container playing a Hetzner debian-12 server.
# Hetzner's image reads its own metadata service; here the seed is NoCloud's
# (/var/lib/cloud/seed/nocloud: user-data, meta-data), written before the container starts.
datasource_list: [NoCloud, None]
# Docker gives the address (Hetzner's DHCP would): cloud-init writes no network config.
network: {config: disabled}
# Docker set the hostname to the server's name already; its /etc/hostname is a bind mount
# that hostnamectl cannot replace.
preserve_hostname: true
disable_root: false
"""


@dataclass(frozen=True, slots=True)
class Recipe:
    """Everything the image is made of; its hash is the image's tag."""

    suite: str = "bookworm"
    variant: str = "minbase"
    packages: tuple[str, ...] = (
        "systemd", "systemd-sysv", "dbus", "cloud-init", "python3", "python3-requests",
        "python3-cffi-backend",  # a virtual dependency of cloud-init debootstrap cannot resolve
        "docker.io", "ca-certificates", "iproute2", "iptables", "openssh-server", "sudo",
        "curl", "procps", "netbase", "kmod", "tzdata", "locales",
    )  # fmt: skip
    files: tuple[tuple[str, str], ...] = (
        ("etc/cloud/cloud.cfg.d/90-sp00ky-rehearsal.cfg", CLOUD_CFG),
        ("etc/locale.gen", "en_US.UTF-8 UTF-8\n"),
        ("etc/default/locale", "LANG=en_US.UTF-8\n"),
    )
    # run in the root file system (chroot) after the files are written: the locale cloud-init
    # would otherwise generate at every first boot, as a cloud image has it already
    commands: tuple[tuple[str, ...], ...] = (("locale-gen",),)
    # emptied, so each server makes its own at its first boot (as Hetzner's image does)
    first_boot: tuple[str, ...] = ("etc/machine-id",)
    removed: tuple[str, ...] = (
        "etc/ssh/ssh_host_*", "var/lib/dbus/machine-id", "var/cache/apt/archives/*.deb",
        "var/lib/apt/lists/*",
    )  # fmt: skip
    changes: tuple[str, ...] = (
        'CMD ["/sbin/init"]',
        "ENV container=docker",
        "VOLUME /var/lib/docker",
        f"LABEL {ROLE_LABEL}=machine-image",
    )

    def digest(self) -> str:
        text = json.dumps(
            [self.suite, self.variant, self.packages, self.files, self.commands,
             self.first_boot, self.removed, self.changes],
        )  # fmt: skip
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    @property
    def tag(self) -> str:
        return f"{REPOSITORY}:{self.digest()}"

    @property
    def has_docker(self) -> bool:
        return any(p in self.packages for p in DOCKER_PACKAGES)

    def without_docker(self) -> Recipe:
        """The same machine without a Docker engine, as a system image boots."""
        kept = tuple(p for p in self.packages if p not in DOCKER_PACKAGES)
        return replace(self, packages=kept)


def _say(message: str) -> None:
    print(f"rehearsal image: {message}", file=sys.stderr, flush=True)


def image_exists(tag: str) -> bool:
    done = subprocess.run(["docker", "image", "inspect", tag], capture_output=True)
    return done.returncode == 0


def ensure_image(
    recipe: Recipe | None = None, mirror: str | None = None, progress: Progress = _say
) -> str:
    """The image's tag, built first if this Docker engine lacks it."""
    recipe = recipe or Recipe()
    if shutil.which("docker") is None:
        raise ImageBuildError("the docker client is not installed (apt-get install docker.io)")
    if image_exists(recipe.tag):
        progress(f"{recipe.tag}: already built")
        return recipe.tag
    build(recipe, mirror or os.environ.get("DEBIAN_MIRROR") or DEFAULT_MIRROR, progress)
    return recipe.tag


def build(recipe: Recipe, mirror: str, progress: Progress = _say) -> None:
    """debootstrap the root file system, write the recipe's files, ``docker import`` it."""
    if shutil.which("debootstrap") is None:
        raise ImageBuildError("debootstrap is not installed (apt-get install debootstrap)")
    started = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="sp00ky-rehearse-rootfs-", dir="/var/tmp"))
    try:
        progress(f"building {recipe.tag}: debootstrap {recipe.suite} from {mirror}")
        _debootstrap(recipe, root, mirror, progress)
        progress(f"debootstrap done after {time.monotonic() - started:.0f}s; configuring")
        _configure(recipe, root)
        progress("importing into Docker")
        _import(recipe, root)
        progress(f"{recipe.tag}: built in {time.monotonic() - started:.0f}s")
    finally:
        shutil.rmtree(root, ignore_errors=True)


# debootstrap's stage lines (not one line a package)
EACH = re.compile(r"^I: (Retrieving|Validating|Extracting|Unpacking|Configuring) \S")
STAGE = re.compile(r"^I: (Retrieving Release|Checking|Resolving|Found|Installing|Base system)")


def _debootstrap(recipe: Recipe, root: Path, mirror: str, progress: Progress) -> None:
    command = [
        "debootstrap", f"--variant={recipe.variant}", f"--include={','.join(recipe.packages)}",
        recipe.suite, str(root), mirror,
    ]  # fmt: skip
    tail: list[str] = []
    counts: dict[str, int] = {}
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = [*tail[-30:], line.rstrip()]
            if STAGE.match(line):
                progress(f"debootstrap: {line.strip()[3:]}")
            elif step := EACH.match(line):  # one line a package: say how far, now and then
                counts[step[1]] = counts.get(step[1], 0) + 1
                if counts[step[1]] % 50 == 0:
                    progress(f"debootstrap: {step[1].lower()} {counts[step[1]]} packages")
    if proc.returncode != 0:
        raise ImageBuildError(
            f"debootstrap {recipe.suite} from {mirror} failed ({proc.returncode}); is the "
            "mirror reachable (DEBIAN_MIRROR)? Last lines:\n" + "\n".join(tail)
        )


def _configure(recipe: Recipe, root: Path) -> None:
    for path, content in recipe.files:
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(content)
    for command in recipe.commands:
        done = subprocess.run(["chroot", str(root), *command], capture_output=True, text=True)
        if done.returncode != 0:
            raise ImageBuildError(f"{' '.join(command)} in the image failed: {done.stderr}")
    for path in recipe.first_boot:
        (root / path).write_text("")
    for pattern in recipe.removed:
        for found in root.glob(pattern):
            if found.is_dir() and not found.is_symlink():
                shutil.rmtree(found)
            else:
                found.unlink()


def _import(recipe: Recipe, root: Path) -> None:
    changes = [part for change in recipe.changes for part in ("--change", change)]
    with subprocess.Popen(
        ["tar", "--numeric-owner", "--xattrs", "-C", str(root), "-c", "."],
        stdout=subprocess.PIPE,
    ) as tar:
        done = subprocess.run(
            ["docker", "import", *changes, "-", recipe.tag],
            stdin=tar.stdout, capture_output=True, text=True,
        )  # fmt: skip
        assert tar.stdout is not None
        tar.stdout.close()
    if tar.returncode != 0 or done.returncode != 0:
        raise ImageBuildError(
            f"docker import of {recipe.tag} failed: tar {tar.returncode}, "
            f"docker {done.returncode}: {done.stderr.strip()}"
        )


def main(argv: list[str] | None = None) -> int:
    """``scripts/rehearsal-image [--without-docker]``: build the image if missing, print its
    tag."""
    args = sys.argv[1:] if argv is None else argv
    if any(a != "--without-docker" for a in args):
        print("usage: scripts/rehearsal-image [--without-docker]", file=sys.stderr)
        return 2
    recipe = Recipe().without_docker() if args else Recipe()
    try:
        print(ensure_image(recipe))
    except ImageBuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
