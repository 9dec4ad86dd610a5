"""A failed boot names its cause: the backend's last lines of output,
bounded and redacted, in `dev`, `pools get`, the incident and `explain`."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from agent.docker import demultiplex
from agent.tail import TAIL_CHARS, output_summary, redact
from tests.helpers import ROOT, cli

BACKEND_SECRET = "s3cr3t-value-of-the-backend"


def test_redact_hides_the_backends_env_values_and_token_like_strings() -> None:
    line = (
        f"connecting with {BACKEND_SECRET} to postgresql://app:pa55word@db/app "
        "Authorization: Bearer abcdefgh12345678 API_KEY=xyz "
        "id 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08 "
        "key AKIAIOSFODNN7EXAMPLEaBcDeFgHiJkLmNoP1234 file /tmp/test_out_of_contact_a0/x.py"
    )
    shown = redact(line, [BACKEND_SECRET, "0"])
    for secret in (BACKEND_SECRET, "pa55word", "abcdefgh12345678", "xyz", "9f86d081884c7d65",
                   "AKIAIOSFODNN7EXAMPLE"):  # fmt: skip
        assert secret not in shown, shown
    assert "postgresql://app:***@db/app" in shown
    assert "/tmp/test_out_of_contact_a0/x.py" in shown  # a path is not a token
    assert "connecting with *** to" in shown


def test_the_output_summary_is_bounded_and_says_when_there_is_none() -> None:
    noisy = [f"line {n} " + "x" * 1000 for n in range(500)]
    summary = output_summary(noisy)
    assert len(summary) <= TAIL_CHARS + 100
    assert "line 499" in summary and "line 0 " not in summary  # the last lines, not the first
    assert output_summary(["", "  "]) == "it wrote no output"


def text_count(lines: list[str], what: str) -> int:
    return sum(what in line for line in lines)


def _project(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "sp00ky.yml"
    config.write_text(
        yaml.safe_dump(
            {
                "mode": "cluster",
                "pools": {"render": {"min": 1}},
                "apps": {
                    "renderer": {
                        "type": "backend",
                        "runOn": {"pool": "render"},
                        "spec": str(ROOT / "examples" / "backend" / "openapi.yml"),
                        "method": {"type": "outbox", "table": "render_job"},
                        "deploy": {
                            "dockerfile": str(ROOT / "examples" / "backend" / "Dockerfile"),
                            "port": 8080,
                            "healthcheck": "/health",
                            "command": ["python3", "wroker.py"],  # a typo: worker.py
                        },
                        "env": {"API_TOKEN": BACKEND_SECRET},
                    }
                },
            }
        )
    )
    return config


def test_a_typo_in_the_command_shows_the_backends_own_words(tmp_path: Path) -> None:
    """`command: [python3, wroker.py]`: dev's line, the machine's failed reason, the breaker's
    incident in `pools get` say python could not open wroker.py; `explain pool` names the
    open breaker and the last failed boot's reason, in text and in JSON."""
    _project(tmp_path)
    env = {
        **os.environ,
        "SPKY_POOL_PORT": "0",
        "SPKY_ADMIN_PORT": "0",
        "SPKY_TICK": "200ms",
        "SPKY_BREAKER_PAUSE": "30s",
    }
    env.pop("SPKY_STORE", None)
    dev = subprocess.Popen(
        [sys.executable, "-m", "sp00ky_infra", "dev", "sp00ky.yml",
         "--plain", "--machines", "local"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert dev.stdout is not None
    printed: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            line = dev.stdout.readline()
            printed.append(line)
            if text_count(printed, "failed to boot") >= 3 or not line:
                break  # three failed boots in a row: the breaker is open
        text = "".join(printed)
        assert "failed to boot" in text, text
        failed = next(line for line in printed if "failed to boot" in line)
        assert "can't open file" in failed and "wroker.py" in failed, failed
        assert "exited before it was ready" in failed
        shown = cli("pools", "get", "render", cwd=tmp_path, env=env)
        assert shown.returncode == 0, shown.stderr
        incident = next(line for line in shown.stdout.splitlines() if "incident" in line)
        assert "can't open file" in incident and "wroker.py" in incident, shown.stdout
        explained = cli("explain", "pool", "render", cwd=tmp_path, env=env)
        assert "breaker open" in explained.stdout, explained.stdout + explained.stderr
        cause = next(line for line in explained.stdout.splitlines() if "last failed boot" in line)
        assert "can't open file" in cause and "wroker.py" in cause, explained.stdout
        assert "exited before it was ready" in cause
        as_json = json.loads(
            cli("explain", "pool", "render", "--json", cwd=tmp_path, env=env).stdout
        )
        assert "can't open file" in as_json["last_failed_boot"]["reason"]
        assert as_json["breaker_failures"] >= 3
    finally:
        dev.send_signal(signal.SIGINT)
        rest, _ = dev.communicate(timeout=30)
        printed.append(rest)
    everything = "".join(printed) + shown.stdout + explained.stdout
    assert BACKEND_SECRET not in everything
    log = (tmp_path / ".sp00ky" / "machines").glob("*.log")
    assert any("can't open file" in path.read_text() for path in log)  # where the README says


def test_a_containers_log_is_read_through_the_engines_frames() -> None:
    frame = b"".join(
        bytes([stream, 0, 0, 0]) + len(text).to_bytes(4, "big") + text
        for stream, text in ((1, b"starting\n"), (2, b"Traceback: boom\n"))
    )
    assert demultiplex(frame).decode().splitlines() == ["starting", "Traceback: boom"]
    assert demultiplex(b"plain text\n") == b"plain text\n"  # a TTY's log has no frames


CORPUS = [
    f"connecting with {BACKEND_SECRET} to postgresql://app:pa55word@db/app",
    "Authorization: Bearer abcdefgh12345678 API_KEY=xyz password: 'hunter 2'",
    "id 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "key AKIAIOSFODNN7EXAMPLEaBcDeFgHiJkLmNoP1234 file /tmp/test_out_of_contact_a0/x.py",
    "Traceback (most recent call last): ModuleNotFoundError: No module named 'numpy'",
]


def test_the_summary_of_a_backends_output_hides_its_secrets_and_keeps_its_errors() -> None:
    summary = output_summary(CORPUS, [BACKEND_SECRET])
    for secret in (BACKEND_SECRET, "pa55word", "abcdefgh12345678", "xyz", "hunter 2",
                   "9f86d081884c7d65", "AKIAIOSFODNN7EXAMPLE"):  # fmt: skip
        assert secret not in summary, summary
    assert "No module named 'numpy'" in summary
    assert summary.count(" | ") == len(CORPUS) - 1


def test_a_boot_timeout_is_one_message_with_the_backends_last_words(tmp_path: Path) -> None:
    """A backend that never answers its healthcheck: the tick fails the machine once, and
    that one message carries what the backend printed (redacted), in dev and the row."""
    config = _project(tmp_path)
    data = yaml.safe_load(config.read_text())
    data["apps"]["renderer"]["deploy"]["command"] = [
        "python3", "-c",
        "import time; print('loading the model, token=abcdefghijklmnop', flush=True); "
        f"print('with {BACKEND_SECRET}', flush=True); time.sleep(60)",
    ]  # fmt: skip
    config.write_text(yaml.safe_dump(data))
    env = {**os.environ, "SPKY_POOL_PORT": "0", "SPKY_ADMIN_PORT": "0", "SPKY_TICK": "200ms"}
    env.pop("SPKY_STORE", None)
    dev = subprocess.Popen(
        [sys.executable, "-m", "sp00ky_infra", "dev", "sp00ky.yml",
         "--plain", "--machines", "local",
         "--timings", "bootTimeout=3s"],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert dev.stdout is not None
    printed: list[str] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and text_count(printed, "failed") < 2:
            line = dev.stdout.readline()
            if not line:
                break
            printed.append(line)
    finally:
        dev.send_signal(signal.SIGINT)
        rest, _ = dev.communicate(timeout=30)
        printed.append(rest)
    failed = [line for line in printed if " failed: " in line]
    assert len(failed) >= 2, "".join(printed)
    first = failed[0].split(" failed: ", 1)[1].split(":", 1)[0]
    about_first = [line for line in printed if first in line and "fail" in line]
    assert len(about_first) == 1, about_first  # one boot timeout, one message
    assert (
        "not ready within the boot timeout (3s); its last output: loading the model"
        in (about_first[0])
    )
    assert "token=***" in about_first[0] and "with ***" in about_first[0]
    assert BACKEND_SECRET not in "".join(printed) and "abcdefghijklmnop" not in "".join(printed)
