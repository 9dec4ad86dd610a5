"""Installing the guardian's systemd timer on an operations host, over SSH with fabric (the
``fabric`` extra: only this command needs an SSH client library)."""

from __future__ import annotations

import io
import shlex
from dataclasses import dataclass

from fabric import Connection

SERVICE = """\
[Unit]
Description=sp00ky guardian: one pass over the project's machines (caps, silent schedulers, 72 h)
Wants=network-online.target
After=network-online.target

[Service]
Type=oneshot
EnvironmentFile=/etc/sp00ky/guardian.env
ExecStart={command} guardian
"""
TIMER = """\
[Unit]
Description=Run the sp00ky guardian every 5 minutes

[Timer]
OnBootSec=2min
OnUnitActiveSec=5min
Persistent=true

[Install]
WantedBy=timers.target
"""


@dataclass(frozen=True, slots=True)
class Installed:
    paths: tuple[str, ...]
    enabled: bool


def install(
    host: str,
    token: str,
    endpoint: str,
    user: str = "root",
    port: int = 22,
    identity: str | None = None,
    root: str = "/",
    command: str = "/usr/local/bin/sp00ky-infra",
    connect_timeout: float = 30,
) -> Installed:
    """Write the service, the timer and the 0600 env file (the token), then enable the timer
    where systemd runs. ``root`` installs under another directory (an image being built)."""
    base = root.rstrip("/")
    files = {
        f"{base}/etc/systemd/system/sp00ky-guardian.service": (
            SERVICE.format(command=command),
            "644",
        ),
        f"{base}/etc/systemd/system/sp00ky-guardian.timer": (TIMER, "644"),
        f"{base}/etc/sp00ky/guardian.env": (
            f"HCLOUD_TOKEN={token}\nHCLOUD_ENDPOINT={endpoint}\n",
            "600",
        ),
    }
    kwargs = {"key_filename": identity} if identity else {}
    with Connection(
        host, user=user, port=port, connect_timeout=connect_timeout, connect_kwargs=kwargs
    ) as conn:
        folders = sorted({path.rsplit("/", 1)[0] for path in files})
        conn.run("mkdir -p " + " ".join(shlex.quote(f) for f in folders), hide=True)
        for path, (text, mode) in files.items():
            conn.put(io.BytesIO(text.encode()), path)
            conn.run(f"chmod {mode} {shlex.quote(path)}", hide=True)
        enabled = False
        if root == "/" and conn.run("command -v systemctl", hide=True, warn=True).ok:
            conn.run(
                "systemctl daemon-reload && systemctl enable --now sp00ky-guardian.timer", hide=True
            )
            enabled = True
    return Installed(tuple(files), enabled)
