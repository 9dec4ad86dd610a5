"""``sp00ky-infra run`` and ``sp00ky-infra jobs [list|get|kill|retry|clear|prune]``."""

from __future__ import annotations

import json
import math
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar, cast
from urllib.parse import quote, urlencode

import click
from rich.table import Table

from sp00ky_infra.cli.cloud import CloudJobs, cloud_call, cloud_everywhere, in_cloud
from sp00ky_infra.cli.dashboard import (
    JOB_COLUMNS,
    JOB_DROPS,
    dashboard,
    job_rows,
    output_console,
    print_listing,
    when,
)
from sp00ky_infra.cli.progress import progress
from sp00ky_infra.client import Client, either, payload_from_text
from sp00ky_infra.config import Config, ConfigError
from sp00ky_infra.config.loader import config_path, load_config
from sp00ky_infra.config.project import default_store_url
from sp00ky_infra.config.rules import SPEC_FIX
from sp00ky_infra.policy import jobs as limits
from sp00ky_infra.policy.jobs import RetryStrategy
from sp00ky_infra.simulate.workload import Arrival, write_trace
from sp00ky_infra.store import STATUSES, SqlStore, StoreError, open_store
from sp00ky_infra.store import store_url as resolve_store_url
from sp00ky_infra.store.policies import (
    declared_policies,
    policy_rows,
)
from sp00ky_infra.store.postgres import redact
from sp00ky_infra.store.retention import counters_json, since_time

EXIT_REFUSED = 1
F = TypeVar("F", bound=Callable[..., Any])


def store_option(func: F) -> F:
    return click.option(
        "--store",
        "store_url",
        envvar="SPKY_STORE",
        help="Store URL (default: $SPKY_STORE, else .sp00ky/state.db next to sp00ky.yml).",
    )(func)


def config_option(func: F) -> F:
    return click.option(
        "--config",
        "config_file",
        envvar="SPKY_CONFIG",
        help="sp00ky.yml to read; the project's store is next to it "
        "(default: $SPKY_CONFIG or ./sp00ky.yml).",
    )(func)


CONFIG_HINT = "pass the path of your sp00ky.yml"
CONFIG_FLAG = "with --config FILE (or set SPKY_CONFIG)"


def with_flag(message: str, flag: str = CONFIG_FLAG) -> str:
    """A config error's hint, naming the way this command takes the file."""
    return message.replace(CONFIG_HINT, f"{CONFIG_HINT} {flag}")


def json_option(func: F) -> F:
    return click.option("--json", "as_json", is_flag=True, help="Print JSON.")(func)


@contextmanager
def refusals() -> Iterator[None]:
    """Turn the library's errors into one clear line and exit 1 (click's usage errors exit 2)."""
    try:
        yield
    except (StoreError, ConfigError) as exc:
        click.echo(f"error: {with_flag(str(exc))}", err=True)
        sys.exit(EXIT_REFUSED)


@contextmanager
def opened(store_url: str | None, config_file: str | None = None) -> Iterator[SqlStore]:
    """The store: ``--store`` / $SPKY_STORE, else the project's, next to its sp00ky.yml; with
    ``--cloud``, the logged-in controller's admin API answering the same calls."""
    if in_cloud():
        yield cast(SqlStore, CloudJobs())
        return
    with refusals():
        store = open_store(resolve_store(store_url, config_file))
    try:
        yield store
    finally:
        store.close()


def resolve_store(store_url: str | None, config_file: str | None) -> str:
    return resolve_store_url(store_url, config_file or None)


def controller_running(store: SqlStore) -> bool:
    """Whether a controller serves ``store``: its leader holds the store's leader lock (a
    file lock beside a SQLite store, an advisory lock on PostgreSQL), freed when it dies."""
    lock = store.leader_lock()
    try:
        if lock.try_acquire():
            lock.release()
            return False
    except Exception:  # cannot tell: say nothing rather than something false
        return True
    return True


def no_controller_hint(store: SqlStore, store_url: str, config_file: str | None) -> str | None:
    """What to say when nothing serves ``store``: jobs written there would wait for good."""
    if controller_running(store):
        return None
    config = str(config_path(config_file or None))
    start = f"start one with `sp00ky-infra dev {config}`"
    if store_url != default_store_url(config_file or None):
        start += " with --store (or SPKY_STORE) naming this store"
    return f"no controller is running for this store ({redact(store_url)}): {start}"


# --- run ---------------------------------------------------------------------------------------
# Every number `run` takes is bounded (docs/jobs.md, "Limits"; the bounds live in policy/jobs.py).
PRIORITY = click.IntRange(-limits.PRIORITY_BOUND, limits.PRIORITY_BOUND)


def _finite(param: click.Parameter, value: float | None) -> float | None:
    """click's FloatRange lets NaN through (no comparison with NaN is true): refuse it."""
    if value is not None and not math.isfinite(value):
        raise click.BadParameter(f"{value} is not a number of seconds", param=param)
    return value


@click.command()
@click.argument("backend")
@click.argument("path")
@click.option("--payload", help="The job's payload as JSON (checked against the backend's spec).")
@click.option(
    "--max-retries",
    type=click.IntRange(0, limits.MAX_RETRIES),
    help="Retries after a failed attempt. [default: the table's policy, 3 unless retuned]",
)
@click.option(
    "--retry-strategy",
    type=click.Choice(["linear", "exponential"]),
    help="Backoff between retries. [default: the table's policy, linear unless retuned]",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True, max=limits.MAX_TIMEOUT_SECONDS),
    callback=lambda _ctx, param, value: _finite(param, value),
    help="Seconds (at most 7 days).",
)
@click.option(
    "--delay",
    type=click.IntRange(0, limits.MAX_DELAY_MS),
    default=0,
    help="Milliseconds to wait first (at most 30 days).",
)
@click.option("--priority", type=PRIORITY, help="Higher runs first (default 0).")
@click.option(
    "--queue-priority", type=PRIORITY, help="The docs' name (queuePriority) for --priority."
)
@click.option(
    "--slots", type=click.IntRange(1, limits.MAX_SLOTS), help="Slots the job takes (default 1)."
)
@click.option(
    "--pool-slots",
    type=click.IntRange(1, limits.MAX_SLOTS),
    help="The docs' name (poolSlots) for --slots.",
)
@click.option("--assigned-to", help="The record the job is for (e.g. thread:abc).")
@click.option(
    "--queue-timeout",
    help="How long the job may wait for a slot: seconds (1800) or a duration (30m); "
    "wins over the pool's queueTimeout.",
)
@json_option
@config_option
@store_option
def run(
    backend: str,
    path: str,
    payload: str | None,
    max_retries: int | None,
    retry_strategy: str | None,
    timeout: float | None,
    delay: int,
    priority: int | None,
    queue_priority: int | None,
    slots: int | None,
    pool_slots: int | None,
    assigned_to: str | None,
    queue_timeout: str | None,
    as_json: bool,
    config_file: str | None,
    store_url: str | None,
) -> None:
    """Create a job: call BACKEND's route PATH with the payload. Prints the new job's id."""
    with refusals():
        body = payload_from_text(payload)
        priority = either(("--priority", "--queue-priority"), priority, queue_priority, default=0)
        slots = either(("--slots", "--pool-slots"), slots, pool_slots, default=1)
        url = resolve_store(store_url, config_file)
        with Client(url, config_file) as client:
            job = client.run(
                backend,
                path,
                body,
                max_retries=max_retries,
                retry_strategy=_strategy(retry_strategy),
                timeout=timeout,
                delay=delay,
                priority=priority,
                slots=slots,
                assigned_to=assigned_to,
                queue_timeout=queue_timeout,
            )
            hint = no_controller_hint(client.store, url, config_file)
            unchecked = unchecked_note(client.config, backend)
    click.echo(json.dumps(job.as_json()) if as_json else job.id)
    if unchecked:
        click.echo(unchecked, err=True)
    if hint:
        click.echo(f"queued; {hint}", err=True)


def unchecked_note(config: Config, backend: str) -> str | None:
    """What ``run`` says once it queued a job whose backend has no spec (lint's SP172): the
    payload was written unchecked. A note, not a refusal: the job is queued."""
    target = config.backends.get(backend)
    if target is None or target.spec:
        return None
    return (
        f"warning: backend {backend!r} has no `spec`, so this job's payload was written "
        f"unchecked; {SPEC_FIX}"
    )


# --- jobs --------------------------------------------------------------------------------------


@click.group(invoke_without_command=True)
@click.option("--refresh", type=click.FloatRange(min=0.1), default=1.0, show_default=True)
@config_option
@store_option
@click.pass_context
def jobs(
    ctx: click.Context, refresh: float, config_file: str | None, store_url: str | None
) -> None:
    """Watch and manage jobs. Without a subcommand: a live dashboard until Ctrl-C (with
    --cloud: the newest jobs, once)."""
    if ctx.invoked_subcommand is None and in_cloud():
        ctx.invoke(list_)
    elif ctx.invoked_subcommand is None:
        try:
            config: Config | None = load_config(config_file or None)
        except ConfigError:
            config = None  # the jobs are still worth watching; the pool tables need the file
        with opened(store_url, config_file) as store:
            note_unserved(store, store_url, config_file)
            dashboard(store, config, refresh)


def note_unserved(store: SqlStore, store_url: str | None, config_file: str | None) -> None:
    """On stderr, when jobs wait in a store that no controller serves."""
    if in_cloud() or store.counts()["pending"] == 0:
        return
    hint = no_controller_hint(store, resolve_store(store_url, config_file), config_file)
    if hint:
        click.echo(f"note: jobs are pending and {hint}", err=True)


@jobs.command("list")
@click.option("--status", type=click.Choice(STATUSES))
@click.option("--limit", type=click.IntRange(min=1), default=100, show_default=True)
@click.option("--table", "table_name", help="Only this outbox table's jobs.")
@click.option("--pool", help="Only this pool's jobs.")
@json_option
@config_option
@store_option
def list_(
    status: Any,
    limit: int,
    table_name: str | None,
    pool: str | None,
    as_json: bool,
    config_file: str | None,
    store_url: str | None,
) -> None:
    """Jobs, newest first."""
    with opened(store_url, config_file) as store, refusals():
        found = store.list_jobs(status=status, limit=limit, table=table_name, pool=pool)
        note_unserved(store, store_url, config_file)
    if as_json:
        click.echo(json.dumps([job.as_json() for job in found], indent=2))
    elif found:
        print_listing(JOB_COLUMNS, job_rows(found), JOB_DROPS)
    else:
        click.echo("no jobs" + (f" with status {status}" if status else ""))


jobs.add_command(list_, "ls")  # the docs' alias


@jobs.command()
@click.argument("job_id")
@json_option
@config_option
@store_option
def get(job_id: str, as_json: bool, config_file: str | None, store_url: str | None) -> None:
    """One job in full: payload, result, every error and attempt."""
    with opened(store_url, config_file) as store, refusals():
        job = store.get(job_id)
        if job.status == "pending":
            note_unserved(store, store_url, config_file)
    if as_json:
        click.echo(json.dumps(job.as_json(), indent=2))
        return
    lines = [
        f"id          : {job.id}",
        f"backend     : {job.backend} {job.path}" + (f" (pool {job.pool})" if job.pool else ""),
        f"status      : {job.status}" + ("  (kill requested)" if job.cancel_requested else ""),
        f"retries     : {job.retries} of {job.max_retries} ({job.retry_strategy})",
        f"priority    : {job.priority}, slots {job.slots}",
        f"created     : {when(job.created_at)}   updated {when(job.updated_at)}",
        f"payload     : {json.dumps(job.payload)}",
        f"result      : {json.dumps(job.result)}",
    ]
    for attempt in job.attempts:
        lines.append(
            f"attempt {attempt.get('number')}   : {attempt.get('id')} on "
            f"{attempt.get('machine') or '-'} from {when(attempt.get('started_at'))} "
            f"-> {attempt.get('outcome') or 'running'}"
        )
    for error in job.errors:
        lines.append(
            f"error       : [{error.get('code')}] {error.get('reason')} "
            f"(attempt {error.get('attempt')}, {when(error.get('at'))})"
        )
    click.echo("\n".join(lines))


@jobs.command()
@click.argument("job_id")
@json_option
@config_option
@store_option
def kill(job_id: str, as_json: bool, config_file: str | None, store_url: str | None) -> None:
    """Cancel a job: a waiting one fails at once, a running one is stopped on its machine."""
    with opened(store_url, config_file) as store, refusals():
        job = store.kill(job_id, time.time())
    if as_json:
        click.echo(json.dumps(job.as_json(), indent=2))
    elif job.status == "failed":
        click.echo(f"{job.id}: killed (failed with code cancelled)")
    else:
        click.echo(f"{job.id}: kill sent to machine {job.machine}; it fails with code cancelled")


@jobs.command()
@click.argument("job_id")
@json_option
@config_option
@store_option
def retry(job_id: str, as_json: bool, config_file: str | None, store_url: str | None) -> None:
    """Run a finished job again as a new attempt (its history stays)."""
    with opened(store_url, config_file) as store, refusals():
        job = store.retry(job_id, time.time())
        note_unserved(store, store_url, config_file)
    if as_json:
        click.echo(json.dumps(job.as_json(), indent=2))
        return
    click.echo(f"{job.id}: pending again (attempt {job.attempt_number + 1} next)")


@jobs.command()
@click.option("--status", type=click.Choice(["success", "failed"]), help="Only this outcome.")
@click.option(
    "--limit", type=click.IntRange(min=1), help="Delete at most this many (oldest finished first)."
)
@click.option("--dry-run", is_flag=True, help="Count what would be deleted; delete nothing.")
@click.option("--yes", "-y", is_flag=True, help="Do not ask on a terminal; delete.")
@json_option
@config_option
@store_option
def clear(
    status: Any,
    limit: int | None,
    dry_run: bool,
    yes: bool,
    as_json: bool,
    config_file: str | None,
    store_url: str | None,
) -> None:
    """Delete finished (success/failed) jobs in batches; they stay counted in the counters.

    They are counted first; on a terminal it asks before deleting (--yes does not ask)."""
    with opened(store_url, config_file) as store, refusals():
        counts = store.counts()
        outcomes = [status] if status else ["success", "failed"]
        found = sum(counts[outcome] for outcome in outcomes)
        count = found if limit is None else min(found, limit)
        what = f"{count} finished job(s)" + (f" ({status})" if status else "")
        if dry_run:
            if as_json:
                click.echo(json.dumps({"would_delete": count, "outcomes": outcomes}, indent=2))
            else:
                click.echo(f"would delete {what}; nothing deleted (--dry-run)")
            return
        asks = count and not yes and sys.stdin.isatty()
        if asks and not click.confirm(f"delete {what}?", default=False, err=True):
            click.echo("nothing deleted", err=True)
            sys.exit(EXIT_REFUSED)
        if as_json:
            deleted = store.clear_jobs(status=status, limit=limit)
            click.echo(json.dumps([job.as_json() for job in deleted], indent=2))
            return
        with progress("deleting finished jobs", count) as advance:
            removed = store.clear(status=status, limit=limit, progress=advance)
    click.echo(f"deleted {removed} finished job(s)")


@jobs.command()
@click.option("--since", help="Only hours from then: a duration back (24h, 7d) or a UTC date/time.")
@click.option("--table", "table_name", help="Only this outbox table's counters.")
@json_option
@config_option
@store_option
def stats(
    since: str | None,
    table_name: str | None,
    as_json: bool,
    config_file: str | None,
    store_url: str | None,
) -> None:
    """The hourly counters retention folds finished rows into, per table and outcome.

    Rows not yet pruned are not in them (`jobs list` shows those)."""
    try:
        start = since_time(since, time.time())
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--since") from exc
    if in_cloud():
        given = {"since": since, "table": table_name}
        found = cloud_call("GET", "/stats?" + urlencode({k: v for k, v in given.items() if v}))
    else:
        with opened(store_url, config_file) as store, refusals():
            found = counters_json(store.counters(table=table_name, since=start), start)
    if as_json:
        click.echo(json.dumps(found, indent=2))
        return
    if not found["hours"]:
        click.echo(
            "no counters"
            + (f" since {when(start)} UTC" if start is not None else "")
            + ": retention folds finished rows into them as it deletes them "
            "(jobs prune, jobs clear, or the controller's own pruning)"
        )
        return
    table = Table(title="jobs folded by retention, per hour (UTC)", show_edge=False)
    for column in ("hour", "table", "outcome", "count"):
        table.add_column(column, justify="right" if column == "count" else "left")
    for hour in found["hours"]:
        table.add_row(when(hour["hour"])[:-3], hour["table"], hour["outcome"], str(hour["count"]))
    output_console().print(table)
    totals = ", ".join(
        f"{total['table']} {total['outcome']} {total['count']}" for total in found["totals"]
    )
    click.echo(f"totals: {totals}")


@jobs.command()
@config_option
@store_option
def prune(config_file: str | None, store_url: str | None) -> None:
    """Apply sp00ky.yml's retention now (the controller also does this on its own)."""
    with refusals():
        retention = load_config(config_file).retention
    with (
        opened(store_url, config_file) as store,
        refusals(),
        progress("pruning finished jobs", None) as advance,
    ):
        report = store.prune(
            time.time(),
            retention.success,
            retention.failed,
            max_rows=retention.max_rows,
            progress=advance,
        )
    parts = ", ".join(f"{count} {outcome}" for outcome, count in report.deleted.items())
    click.echo(f"pruned {report.total} job(s)" + (f" ({parts})" if parts else ""))


@jobs.command()
@click.option("--backend", help="Only this backend's jobs.")
@click.option("--limit", type=int, default=1_000_000, show_default=True)
@click.option(
    "--format", "fmt", type=click.Choice(["csv", "jsonl"]), default="csv", show_default=True
)
@click.option("--out", "out_file", type=click.Path(dir_okay=False), help="Write here, not stdout.")
@config_option
@store_option
def export(
    backend: str | None,
    limit: int,
    fmt: str,
    out_file: str | None,
    config_file: str | None,
    store_url: str | None,
) -> None:
    """Write the retained jobs that ran as a trace for `sp00ky-infra simulate --trace`.

    Each job is one arrival: its created_at, the run time of its last attempt, its backend,
    priority, slots and delay. Jobs that never started have no run time and are left out.
    """
    with opened(store_url, config_file) as store:
        found = store.list_jobs(limit=limit)
    arrivals = []
    for job in reversed(found):  # oldest first
        if backend is not None and job.backend != backend:
            continue
        if job.started_at is None or job.finished_at is None:
            continue
        arrivals.append(
            Arrival(
                at=job.created_at,
                duration=max(0.0, job.finished_at - job.started_at),
                backend=job.backend,
                priority=job.priority,
                slots=job.slots,
                delay=job.delay_ms / 1000.0,
            )
        )
    if out_file:
        with open(out_file, "w") as out:
            count = write_trace(arrivals, out, fmt)
    else:
        count = write_trace(arrivals, sys.stdout, fmt)
    click.echo(f"{count} jobs exported ({len(found) - count} left out)", err=True)


def _strategy(name: str | None) -> RetryStrategy | None:
    return None if name is None else "exponential" if name == "exponential" else "linear"


@jobs.command()
@click.argument("table", required=False)
@click.option(
    "--concurrency",
    help="At most this many of the table's jobs at once (a whole number), or `none`: no cap.",
)
@click.option("--max-retries", type=click.IntRange(0, limits.MAX_RETRIES))
@click.option("--retry-strategy", type=click.Choice(["linear", "exponential"]))
@json_option
@config_option
@store_option
def policy(
    table: str | None,
    concurrency: str | None,
    max_retries: int | None,
    retry_strategy: str | None,
    as_json: bool,
    config_file: str | None,
    store_url: str | None,
) -> None:
    """Show each outbox table's job policy, or retune one live: `jobs policy job
    --concurrency 20`. The next tick admits by it; a deploy writes sp00ky.yml's again only
    when the file's lines for the table changed."""
    changes = _policy_changes(concurrency, max_retries, retry_strategy)
    if in_cloud():
        shown = _cloud_policies(table, changes)
    else:
        shown = _local_policies(table, changes, config_file, store_url)
    if as_json:
        click.echo(json.dumps(shown if table is None else shown[0], indent=2))
        return
    for row in shown:
        cap = row["concurrency"] if row["concurrency"] is not None else "no cap"
        click.echo(
            f"{row['table']}: concurrency {cap}, retries {row['max_retries']} "
            f"({row['retry_strategy']}); set by {row['updated_by']}"
        )
    if changes:
        click.echo("the controller admits by it from its next tick (within 2 s)")


def _policy_changes(
    concurrency: str | None, max_retries: int | None, retry_strategy: str | None
) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if concurrency is not None:
        if concurrency.lower() == "none":
            changes["concurrency"] = None
        elif concurrency.isdigit() and int(concurrency) >= 1:
            changes["concurrency"] = int(concurrency)
        else:
            raise click.BadParameter(
                f"{concurrency!r}: a whole number of 1 or more, or none", param_hint="--concurrency"
            )
    if max_retries is not None:
        changes["max_retries"] = max_retries
    if retry_strategy is not None:
        changes["retry_strategy"] = retry_strategy
    return changes


def _local_policies(
    table: str | None, changes: dict[str, Any], config_file: str | None, store_url: str | None
) -> list[dict[str, Any]]:
    """`jobs policy` on the store itself: the tables sp00ky.yml declares."""
    with refusals():
        tables = declared_policies(load_config(config_path(config_file)))
    _known_table(table, changes, sorted(tables))
    with opened(store_url, config_file) as store, refusals():
        if changes:
            assert table is not None
            store.policies.retune(table, changes, time.time(), "jobs policy")
        return policy_rows(store.policies.read(), tables, table)


def _cloud_policies(table: str | None, changes: dict[str, Any]) -> list[dict[str, Any]]:
    """`jobs policy --cloud`: the tables the logged-in controller serves."""
    rows: list[dict[str, Any]] = cloud_call("GET", "/jobs/policies")
    _known_table(table, changes, [row["table"] for row in rows])
    if changes:
        return [cloud_call("PATCH", f"/jobs/policies/{quote(str(table), safe='')}", changes)]
    return [row for row in rows if table is None or row["table"] == table]


def _known_table(table: str | None, changes: dict[str, Any], tables: list[str]) -> None:
    if changes and table is None:
        raise click.UsageError("name the TABLE to retune (tables: " + ", ".join(tables) + ")")
    if table is not None and table not in tables:
        raise click.BadParameter(
            f"no outbox table {table!r} of a pool backend in sp00ky.yml "
            f"(tables: {', '.join(tables) or 'none'})",
            param_hint="TABLE",
        )


cloud_everywhere(jobs)
