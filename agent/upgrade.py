"""The agent's upgrade to the agent archive its controller serves.

The controller names the archive it serves (its sha256) in every join and rejoin reply, and
in a poll's reply while the machine runs another. An agent that runs another upgrades itself
once it runs no job: it stops taking work, lets the jobs it runs finish (its polls renew
their leases), then fetches the archive with its session, checks it against the sha256 of
that authenticated reply, unpacks it whole into a new directory, switches to it atomically
and re-executes itself. A job still running a lease after the agent stopped taking work
defers the upgrade: the agent takes work again and tries later, as after a failure (a
mismatch, an archive that does not unpack), with backoff, the old agent serving meanwhile.

Under the agent's home (``settings.agent_home``; /opt/sp00ky on a VM):

    releases/SHA256/            an archive unpacked whole: its agent/, install-agent.sh, unit
                                (the one switched to, and the one running until it ends)
    current -> releases/SHA256  the agent to run, switched by renaming a new link over it
    installed                   the sha256 of the agent installed first (home/agent)

The restart is an exec of the same process (``python3 -m agent``, ``current`` first on its
PYTHONPATH): it keeps its pid and whatever supervises it (a VM's systemd unit, a machine
container's PID 1, a local machine's session) and its credential file, so it rejoins as the
same machine. An agent started from the one installed first (the unit, after a reboot) runs
``current`` instead, before it joins (``relaunch``). The unit and install-agent.sh of a
release are not installed again: they ride along.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Literal, NoReturn

from agent.clock import Clock
from agent.controller import backoff
from agent.errors import AgentError, ControllerError, Gone
from agent.logs import Log

RETRY_FIRST_SECONDS = 5.0  # after a failed or deferred upgrade; doubling, with jitter
RETRY_CAP_SECONDS = 600.0
# In the environment of an agent an upgrade or a relaunch started: the release it meant to
# run. An agent that finds it and runs another does not start it again: no exec loop.
RELAUNCHED = "SPKY_AGENT_RELAUNCHED"
PACKAGE = Path(__file__).resolve().parent  # the running agent's package
Step = Literal["claim", "hold", "go"]


class UpgradeError(AgentError):
    """The archive fetched is not the one named, or does not unpack into an agent."""


def release_of(package: Path) -> str | None:
    """The sha256 of the release the agent at ``package`` runs from (HOME/releases/SHA256/
    agent), or None (the agent installed first, a checkout)."""
    release = package.parent
    if release.parent.name == "releases" and _is_sha256(release.name):
        return release.name
    return None


def home_of(setting: str, package: Path = PACKAGE) -> Path | None:
    """The agent's home: its setting, or where it was installed from an archive (beside its
    install-agent.sh, or the home of the release it runs); None where it was not."""
    if setting:
        return Path(setting)
    if release_of(package):
        return package.parent.parent.parent
    if (package.parent / "install-agent.sh").is_file():
        return package.parent
    return None


def own_sha256(home: Path | None, package: Path = PACKAGE) -> str | None:
    """The sha256 of the archive the running agent came from, when it is known."""
    release = release_of(package)
    if release or home is None:
        return release
    with contextlib.suppress(OSError):
        installed = (home / "installed").read_text().strip()
        if _is_sha256(installed):
            return installed
    return None


def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def install(home: Path, archive: bytes, expected: str, log: Log) -> Path:
    """The archive checked against ``expected``, unpacked whole into releases/EXPECTED (a
    directory renamed into place once complete) and made ``current``: the release.
    UpgradeError when the archive is another or does not unpack into an agent."""
    actual = hashlib.sha256(archive).hexdigest()
    if actual != expected:
        raise UpgradeError(
            f"the archive fetched has sha256 {actual}, the controller named {expected}"
        )
    releases = home / "releases"
    release = releases / expected
    if not (release / "agent" / "__init__.py").is_file():
        try:
            releases.mkdir(parents=True, exist_ok=True)
            staging = Path(tempfile.mkdtemp(prefix=f".{expected[:12]}-", dir=releases))
        except OSError as exc:
            raise UpgradeError(f"cannot unpack into {releases}: {exc}") from exc
        try:
            _unpack(archive, staging)
            shutil.rmtree(release, ignore_errors=True)  # an incomplete one left by hand
            os.rename(staging, release)
        except (OSError, tarfile.TarError, EOFError) as exc:
            raise UpgradeError(f"the archive does not unpack: {exc}") from exc
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        log("upgrade_unpacked", path=release)
    try:
        link = home / ".current.new"
        link.unlink(missing_ok=True)
        os.symlink(Path("releases") / expected, link)
        os.replace(link, home / "current")  # atomic: the old agent or the new, never neither
    except OSError as exc:
        raise UpgradeError(f"cannot switch {home / 'current'} to it: {exc}") from exc
    log("upgrade_switched", current=home / "current", release=expected)
    return release


def prune(home: Path, keep: set[str | None]) -> None:
    """The releases but those in ``keep`` removed, and what an interrupted unpack left."""
    with contextlib.suppress(OSError):
        for entry in (home / "releases").iterdir():
            if entry.name not in keep:
                shutil.rmtree(entry, ignore_errors=True)


def _unpack(archive: bytes, into: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:bz2") as tar:
        # Checked already; the filter (no links out, no devices), where this Python has it,
        # is a second guard
        if hasattr(tarfile, "data_filter"):
            tar.extraction_filter = tarfile.data_filter
        tar.extractall(into)
    if not (into / "agent" / "__init__.py").is_file():
        raise UpgradeError("the archive holds no agent package (agent/__init__.py)")


def restart_env(env: Mapping[str, str], home: Path, release: str) -> dict[str, str]:
    """The environment the agent runs ``release`` with: ``current`` first on PYTHONPATH."""
    current = str(home / "current")
    path = [current, *(p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p != current)]
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in path if p), RELAUNCHED: release}


def execute(env: Mapping[str, str]) -> NoReturn:
    """This process becomes ``python3 -m agent`` with ``env``: the same pid and supervisor."""
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-m", "agent"], dict(env))


def relaunch(setting: str, log: Log, run: Callable[[Mapping[str, str]], None] = execute) -> None:
    """An agent started from another than ``current`` (the one installed first, as the unit
    starts it after a reboot) runs ``current`` instead; otherwise nothing."""
    home = home_of(setting)
    if home is None:
        return
    try:
        target = Path(os.readlink(home / "current")).name
    except OSError:
        return  # never upgraded
    if target in (release_of(PACKAGE), os.environ.get(RELAUNCHED)):
        return
    if not (home / "current" / "agent" / "__init__.py").is_file():
        return
    log("relaunch", release=target)
    run(restart_env(os.environ, home, target))


class Upgrade:
    """When the agent upgrades: ``served`` learns what the controller serves, ``step`` says
    on each pass of the loop whether it takes work, holds (an upgrade is due and jobs run)
    or goes (none runs), ``attempt`` fetches and installs."""

    def __init__(self, home: Path | None, own: str | None, log: Log, clock: Clock) -> None:
        self.home, self.own, self.log, self.clock = home, own, log, clock
        self.target: str | None = None  # the archive served, when it is not this agent's
        self.attempts = 0  # failed or deferred in a row: their backoff
        self.retry_at = 0.0
        self.quiet_since: float | None = None  # when the agent stopped taking work for it

    def served(self, sha256: str | None, first_join: bool = False) -> None:
        """The controller's join or poll reply named the archive it serves. At the first
        join an agent that does not know its own runs that one (installed from it)."""
        if not sha256 or sha256 == self.target:
            return
        if self.own is None and first_join:
            self._installed(sha256)
        if sha256 == self.own:
            if self.target is not None:
                self.log("upgrade_cancelled", served=sha256)
            self.target = None
            return
        self.target, self.attempts, self.quiet_since = sha256, 0, None
        self.retry_at = self.clock.now()
        if self.home is None:
            self.log("upgrade_skipped", served=sha256, reason="no agent home (agent_home)")
        else:
            self.log("upgrade_due", served=sha256, running=self.own or "unknown")

    def _installed(self, sha256: str) -> None:
        self.own = sha256
        if self.home is not None:
            with contextlib.suppress(OSError):  # unkept, a restart upgrades once needlessly
                self.home.mkdir(parents=True, exist_ok=True)
                (self.home / "installed").write_text(sha256 + "\n")

    def step(self, busy: int, lease: float) -> Step:
        """``busy``: the jobs the agent holds (running, or results not yet acknowledged)."""
        if self.target is None or self.home is None:
            return "claim"
        now = self.clock.now()
        if now < self.retry_at:
            return "claim"
        if self.quiet_since is None:
            self.quiet_since = now
            if busy:
                self.log("upgrade_waiting", jobs=busy, at_most=f"{lease:g}s")
        if not busy:
            return "go"
        if now - self.quiet_since >= lease:
            self.later("upgrade_deferred", f"a job still runs {lease:g}s after work stopped")
            return "claim"
        return "hold"

    def attempt(self, fetch: Callable[[], bytes]) -> Path | None:
        """Fetch, check, unpack, switch: the release to restart into, or None (logged,
        tried again after a backoff)."""
        assert self.target is not None and self.home is not None
        try:
            archive = fetch()
            self.log("upgrade_fetched", bytes=len(archive))
            release = install(self.home, archive, self.target, self.log)
        except Gone:
            raise
        except (ControllerError, UpgradeError) as exc:
            self.later("upgrade_failed", str(exc))
            return None
        prune(self.home, {self.target, self.own})  # the new one, and this one's until it ends
        return release

    def later(self, event: str, reason: str) -> None:
        wait = backoff(self.attempts, RETRY_FIRST_SECONDS, RETRY_CAP_SECONDS)
        self.attempts += 1
        self.retry_at, self.quiet_since = self.clock.now() + wait, None
        self.log(event, reason=reason, retry_in=f"{wait:.1f}s")
