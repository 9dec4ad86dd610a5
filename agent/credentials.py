"""The machine credential the first join issues: kept in a file (0600, never logged) so that
the agent rejoins with it after a reboot or a restart instead of its one-time join token."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from agent.logs import Log


class Credentials:
    def __init__(self, path: str | None, log: Log) -> None:
        self.path = path
        self.log = log

    def read(self) -> str | None:
        """The machine credential of an earlier join, if this machine kept one."""
        path = self.path
        if not path:
            return None
        try:
            credential = Path(path).read_text().strip()
        except FileNotFoundError:
            self.log("credential_none", path=path, next="join")
            return None
        except OSError as exc:
            self.log("credential_unreadable", path=path, reason=exc, next="join")
            return None
        if not credential:
            self.log("credential_none", path=path, next="join")
            return None
        self.log("credential_found", path=path, next="rejoin")
        return credential

    def save(self, credential: str) -> None:
        """Kept 0600 beside the settings (written whole, then renamed into place); never in
        the log. Unsaved, the machine still works but cannot rejoin after a reboot."""
        path = self.path
        if not path:
            self.log("credential_unsaved", reason="no credential_file setting")
            return
        target = Path(path)
        temporary = target.with_name(f".{target.name}.tmp")
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
            descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as file:
                file.write(credential + "\n")
                file.flush()
                os.fsync(file.fileno())
            os.replace(temporary, target)
        except OSError as exc:
            self.log("credential_unsaved", path=path, reason=exc)
            return
        self.log("credential_saved", path=path)
