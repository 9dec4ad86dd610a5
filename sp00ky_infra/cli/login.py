"""``sp00ky-infra login URL`` and ``logout``: the admin API of a controller elsewhere, kept for
``--cloud`` (the Jobs docs' ``spky jobs --cloud``): ``jobs``, ``pools``, ``schedules`` and
``explain`` then go through that controller instead of a local store or controller.

The URL and token are kept in the user's config directory (``$XDG_CONFIG_HOME/sp00ky/
login.json``, else ``~/.config/sp00ky/login.json``), readable by the user alone (0600, in a
0700 directory). ``login`` checks both against the API before it keeps them.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click
import requests

LOGIN_FILE = "login.json"
CHECK_SECONDS = 15.0


class NotLoggedIn(Exception):
    """``--cloud`` without a login; the message says what to run."""


def login_path() -> Path:
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "sp00ky" / LOGIN_FILE


def cloud_login() -> tuple[str, str]:
    """The kept admin URL and token, or NotLoggedIn."""
    path = login_path()
    try:
        kept = json.loads(path.read_text())
        return str(kept["url"]), str(kept["token"])
    except FileNotFoundError:
        raise NotLoggedIn(
            "--cloud needs a controller to talk to: run `sp00ky-infra login URL` first "
            "(URL: the controller's admin API, e.g. https://admin.example.com)"
        ) from None
    except (OSError, ValueError, KeyError) as exc:
        message = f"{path} cannot be read ({exc}); run `sp00ky-infra login URL` again"
        raise NotLoggedIn(message) from exc


def _keep(url: str, token: str) -> Path:
    path = login_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), 0o600)  # an older file kept its mode: not this one
        json.dump({"url": url, "token": token}, out)
    return path


def _check(url: str, token: str) -> str | None:
    """None when the admin API at ``url`` takes ``token``, else why not."""
    try:
        answer = requests.get(
            f"{url}/pools", headers={"Authorization": f"Bearer {token}"}, timeout=CHECK_SECONDS
        )
    except requests.RequestException as exc:
        return f"cannot reach {url} ({exc.__class__.__name__}); is it the controller's admin API?"
    if answer.status_code == 401:
        return f"{url} refused the token: use the controller's SPKY_ADMIN_TOKEN"
    if answer.status_code != 200:
        return f"{url}/pools answered {answer.status_code}; is it the controller's admin API?"
    return None


@click.command()
@click.argument("url")
@click.option(
    "--token",
    envvar="SPKY_ADMIN_TOKEN",
    help="The controller's admin token (default: $SPKY_ADMIN_TOKEN, else asked for).",
)
def login(url: str, token: str | None) -> None:
    """Keep a controller's admin URL and token for `--cloud` (jobs, pools, schedules,
    explain)."""
    if not url.startswith(("http://", "https://")):
        raise click.BadParameter(f"{url!r}: an http:// or https:// URL", param_hint="URL")
    url = url.rstrip("/")
    if not token:
        token = click.prompt("admin token", hide_input=True, err=True).strip()
    problem = _check(url, token or "")
    if problem:
        click.echo(f"error: {problem}; nothing kept", err=True)
        sys.exit(1)
    path = _keep(url, token or "")
    click.echo(f"logged in to {url} (kept in {path}, readable by you only)")
    click.echo("--cloud on jobs, pools, schedules and explain now goes there")


@click.command()
def logout() -> None:
    """Forget the admin URL and token `login` kept."""
    path = login_path()
    try:
        path.unlink()
    except FileNotFoundError:
        click.echo("not logged in; nothing to forget")
        return
    click.echo(f"logged out ({path} removed)")
