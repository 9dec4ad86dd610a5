"""``--cloud``: the commands that read a local store or controller go through the admin API of
the controller ``sp00ky-infra login`` kept instead (cli/login.py).

``cloud_option`` adds the flag to a command or a group (``jobs --cloud list`` and ``jobs list
--cloud`` alike); ``in_cloud`` says whether it was given anywhere on the command line.
``CloudJobs`` answers the store calls the ``jobs`` commands make, over the admin API.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import quote, urlencode

import click
import requests

from sp00ky_infra.store import Job

CLOUD = "sp00ky.cloud"
F = TypeVar("F", bound=Callable[..., Any])


class AdminError(Exception):
    """The admin API could not be reached, or refused; the message says what to do."""


def request(url: str, token: str, method: str, path: str, body: Any = None) -> Any:
    """One call of the admin API at ``url``: its JSON answer, or AdminError."""
    try:
        answer = requests.request(
            method,
            f"{url}{path}",
            headers={"Authorization": f"Bearer {token}"},
            json=body,
            timeout=30,
        )
    except requests.RequestException as exc:
        raise AdminError(
            f"cannot reach the admin API at {url} ({exc.__class__.__name__}); is the "
            "controller running? Point at it with --admin-url URL (or SPKY_ADMIN_URL), or "
            "at its project with --config FILE"
        ) from exc
    if answer.status_code >= 400:
        try:
            message = answer.json().get("error") or answer.text
        except ValueError:
            message = answer.text
        raise AdminError(message)
    return answer.json()


def _mark(ctx: click.Context, _: click.Parameter, value: bool) -> None:
    if value:
        ctx.meta[CLOUD] = True  # meta is shared by a context and its children


def cloud_option(func: F) -> F:
    return click.option(
        "--cloud",
        is_flag=True,
        expose_value=False,
        callback=_mark,
        help="Go through the controller `sp00ky-infra login` kept, not a local store.",
    )(func)


def cloud_everywhere(group: click.Group) -> None:
    """``--cloud`` on ``group`` and each of its commands: before or after the subcommand."""
    for command in (group, *group.commands.values()):
        cloud_option(command)


def in_cloud() -> bool:
    ctx = click.get_current_context(silent=True)
    return bool(ctx is not None and ctx.meta.get(CLOUD))


def cloud_call(method: str, path: str, body: Any = None) -> Any:
    """One call to the logged-in controller's admin API; a refusal is printed, exit 1."""
    from sp00ky_infra.cli.login import NotLoggedIn, cloud_login

    try:
        url, token = cloud_login()
        return request(url, token, method, path, body)
    except (NotLoggedIn, AdminError) as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(1)


def part(text: str) -> str:
    return quote(text, safe="")


class CloudJobs:
    """The ``jobs`` commands' store calls, over the logged-in controller's admin API."""

    def list_jobs(
        self,
        status: str | None = None,
        limit: int = 100,
        table: str | None = None,
        pool: str | None = None,
    ) -> list[Job]:
        given = {"status": status, "limit": limit, "table": table, "pool": pool}
        query = urlencode({k: v for k, v in given.items() if v is not None})
        return [Job.from_json(found) for found in cloud_call("GET", f"/jobs?{query}")]

    def get(self, job_id: str) -> Job:
        return Job.from_json(cloud_call("GET", f"/jobs/{part(job_id)}"))

    def kill(self, job_id: str, _now: float) -> Job:
        return Job.from_json(cloud_call("POST", f"/jobs/{part(job_id)}/kill"))

    def retry(self, job_id: str, _now: float) -> Job:
        return Job.from_json(cloud_call("POST", f"/jobs/{part(job_id)}/retry"))

    def close(self) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        command = click.get_current_context().command_path
        raise click.UsageError(
            f"`{command}` works on the store itself, not over --cloud; run it where the "
            "store is (or with --store URL)"
        )
