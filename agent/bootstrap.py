"""A pool machine's first boot: run once by cloud-init from the user-data, which carries this
file and the agent's settings, never the agent itself (``python3 bootstrap.py SHA256 [ROOT]``).
The standard library only: nothing else is installed yet. It imports nothing of the agent.

It reads the settings cloud-init wrote (ROOT/etc/sp00ky/agent.json), fetches the agent archive
from the controller (``GET /v1/machines/{name}/agent``, the machine's join token as bearer;
the join spends the token later) and checks its sha256 against SHA256, the user-data's,
before any of it is unpacked. Then it unpacks it into ROOT/opt/sp00ky, with the sha256 beside
it (``SHA256_FILE``), and runs its ``install-agent.sh`` (Docker and python3-requests where
missing, the unit, the agent started). A machine booted from a baked snapshot has the agent
there already, unpacked by the bake with the same file beside it: when that file says SHA256
nothing is fetched (``event=agent_present``), else the archive is (``event=agent_fetched``).
A mismatch, or an install that fails, is the machine's failed boot: reported with its reason
(``POST /v1/machines/{name}/boot-failed``), and nothing of the archive runs. Every call is
retried with backoff while the controller is unreachable or answers 5xx (503: a standby),
for BUDGET_SECONDS; then the controller's boot timeout fails the machine.

Logs go to stdout (cloud-init's output log): ``sp00ky-bootstrap event=NAME ...``. Exit codes:
0 installed; 1 a failed boot, a refusal (4xx: a bad or spent token, a failed machine) or no
answer within the budget.
"""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import random
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from pathlib import Path

BUDGET_SECONDS = 600.0  # as long as the agent tries to join
# beside the unpacked agent: the sha256 of the archive it came from (cloud-init/bake.py writes it
# too, so that a machine booted from a baked snapshot fetches nothing)
SHA256_FILE = "agent.sha256"


def log(event: str, detail: object) -> None:
    print(f"sp00ky-bootstrap event={event} {detail}", flush=True)


def call(url: str, token: str, body: dict[str, str] | None = None) -> bytes:
    """The answer to a GET of ``url`` (a POST of ``body``): OSError for a 4xx (final) or no
    answer within the budget; the rest is retried with capped exponential backoff and jitter."""
    data = None if body is None else json.dumps(body).encode()
    headers = {"Authorization": "Bearer " + token, "Content-Type": "application/json"}
    deadline, attempt = time.monotonic() + BUDGET_SECONDS, 0
    while True:
        try:
            with urllib.request.urlopen(
                urllib.request.Request(url, data, headers), timeout=60
            ) as r:
                answer: bytes = r.read()
                return answer
        except urllib.error.HTTPError as exc:
            if exc.code < 500:  # refused: final, with the controller's reason
                raise OSError(f"{exc}: {exc.read()[:300].decode(errors='replace')}") from exc
            problem: Exception = exc
        except (OSError, http.client.HTTPException) as exc:
            problem = exc
        if time.monotonic() > deadline:
            raise OSError(f"{url}: no answer in {BUDGET_SECONDS:.0f}s ({problem})")
        log("retry", f"url={url} reason={problem}")
        time.sleep(random.uniform(0.5, 1.0) * min(30.0, 2.0**attempt))
        attempt += 1


def present(home: Path, expected: str) -> bool:
    """Whether the agent unpacked at ``home`` came from the archive the user-data expects."""
    try:
        return (home / SHA256_FILE).read_text().strip() == expected
    except OSError:
        return False


def unpack(archive: bytes, home: Path, sha256: str) -> None:
    """Unpack the checked archive into ``home``, its sha256 beside it."""
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:bz2") as tar:
        # Checked already; the filter (no links out, no devices), where this Python has it,
        # is a second guard: Debian 12's 3.11.2 has none
        if hasattr(tarfile, "data_filter"):
            tar.extraction_filter = tarfile.data_filter
        tar.extractall(home)
    (home / SHA256_FILE).write_text(sha256 + "\n")


def fetched(machine: str, token: str, expected: str, home: Path) -> str:
    """Fetch, check and unpack the archive: "" when done, else why the boot failed."""
    archive = call(machine + "/agent", token)
    actual = hashlib.sha256(archive).hexdigest()
    if actual != expected:
        return (f"the agent fetched from the controller has sha256 {actual}, "
                f"the user-data expects {expected}")  # fmt: skip
    log("agent_fetched", f"sha256={actual}")
    unpack(archive, home, actual)
    return ""


def main(expected: str, root: str = "/") -> int:
    settings = json.loads(Path(root, "etc/sp00ky/agent.json").read_text())
    machine = f"{settings['controller_url'].rstrip('/')}/v1/machines/{settings['machine']}"
    token = settings["join_token"]
    home = Path(root) / "opt" / "sp00ky"
    try:
        if present(home, expected):
            log("agent_present", f"sha256={expected}")
            reason = ""
        else:
            reason = fetched(machine, token, expected, home)
        if not reason:
            code = subprocess.call(["sh", str(home / "install-agent.sh"), str(root)])
            reason = f"install-agent.sh exited {code}" if code else ""
        if not reason:
            log("installed", f"sha256={expected}")
            return 0
        log("boot_failed", f"reason={reason}")
        call(machine + "/boot-failed", token, {"reason": reason})
    except OSError as exc:  # refused, unanswered, or the disk
        log("failed", f"reason={exc}")
    return 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
