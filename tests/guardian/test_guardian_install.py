"""`guardian install` over SSH (fabric) against a throwaway sshd on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import socket
import stat
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import need_service
from tests.helpers import cli_process


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    if not Path("/usr/sbin/sshd").exists() or shutil.which("ssh-keygen") is None:
        need_service("an SSH server", "apt-get install openssh-server")
    keys = tmp_path / "ssh"
    keys.mkdir()
    for name in ("host", "client"):
        subprocess.run(
            ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / name)], check=True
        )
    (keys / "authorized_keys").write_text((keys / "client.pub").read_text())
    port = _free_port()
    config = keys / "sshd_config"
    config.write_text(
        f"Port {port}\nListenAddress 127.0.0.1\nHostKey {keys / 'host'}\n"
        f"PidFile {keys / 'sshd.pid'}\nAuthorizedKeysFile {keys / 'authorized_keys'}\n"
        "PasswordAuthentication no\nSubsystem sftp internal-sftp\n"
        "KbdInteractiveAuthentication no\nPubkeyAuthentication yes\n"
        "PermitRootLogin prohibit-password\nStrictModes no\nUsePAM no\n"
    )
    Path("/run/sshd").mkdir(exist_ok=True)  # sshd's privilege separation directory
    proc = subprocess.Popen(
        ["/usr/sbin/sshd", "-D", "-e", "-f", str(config)], stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield port, keys / "client"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_install_writes_the_timer_service_and_a_private_env_file(
    tmp_path: Path, sshd: tuple[int, Path]
) -> None:
    port, key = sshd
    root = tmp_path / "ops-host"
    env = {"HCLOUD_TOKEN": "ops-token-123", "HCLOUD_ENDPOINT": "https://api.example.invalid/v1"}
    done = cli_process(
        "guardian", "install", "--host", "127.0.0.1", "--port", str(port), "--user", "root",
        "--identity", str(key), "--root", str(root), env=env, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    service = root / "etc/systemd/system/sp00ky-guardian.service"
    timer = root / "etc/systemd/system/sp00ky-guardian.timer"
    secrets = root / "etc/sp00ky/guardian.env"
    assert "ExecStart=/usr/local/bin/sp00ky-infra guardian" in service.read_text()
    assert "OnUnitActiveSec=5min" in timer.read_text()
    assert (
        secrets.read_text()
        == "HCLOUD_TOKEN=ops-token-123\nHCLOUD_ENDPOINT=https://api.example.invalid/v1\n"
    )
    assert stat.S_IMODE(os.stat(secrets).st_mode) == 0o600
    assert f"wrote 127.0.0.1:{secrets}" in done.stdout
    assert "enable sp00ky-guardian.timer yourself" in done.stdout


def test_install_refuses_without_a_token_and_reports_ssh_failures(tmp_path: Path) -> None:
    assert (
        cli_process(
            "guardian", "install", "--host", "127.0.0.1", env={"HCLOUD_TOKEN": ""}
        ).returncode
        == 2
    )
    failed = cli_process(
        "guardian", "install", "--host", "127.0.0.1", "--port", str(_free_port()),
        "--root", str(tmp_path), env={"HCLOUD_TOKEN": "t"}, timeout=60,
    )  # fmt: skip
    assert failed.returncode == 1 and "installing on root@127.0.0.1" in failed.stderr
