"""The MCP server of ``sp00ky-infra mcp``: the admin operations as MCP tools, for an assistant.

Built on the official MCP Python SDK (``MCPServer``): it does the JSON-RPC framing, the
initialize handshake and each tool's JSON Schema (from the type hints below). Each tool does
what its command does: pools, a schedule's pause, drain and explain through the admin API
(found as ``pools`` finds it: $SPKY_ADMIN_URL, $SPKY_ADMIN_TOKEN, or ``.sp00ky/``), jobs
through the store ($SPKY_STORE). A refusal comes back as a tool error whose message says what to do.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, Literal, TypeVar
from urllib.parse import quote

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

from sp00ky_infra import __version__
from sp00ky_infra.cli.cloud import AdminError
from sp00ky_infra.cli.pools import admin_request
from sp00ky_infra.store import SqlStore, StoreError, open_store, store_url
from sp00ky_infra.store.policies import TablePolicy, policy_json

T = TypeVar("T")
Status = Literal["pending", "processing", "success", "failed"]


def _part(value: str) -> str:
    return quote(value, safe="")


def _admin(method: str, path: str) -> Any:
    """An admin API call; a refusal becomes a tool error the assistant reads (the SDK shows
    only ToolError messages: any other exception is a crash whose text stays here)."""
    try:
        return admin_request(method, path)
    except AdminError as exc:
        raise ToolError(str(exc)) from exc


def build(store: str | None = None) -> MCPServer:
    """The server and its tools; ``store`` is the jobs' store URL (default $SPKY_STORE)."""
    server = MCPServer(
        "sp00ky-infra",
        version=__version__,
        instructions="Machine pools for sp00ky backends: look at pools and jobs, pause and "
        "resume a pool or a schedule, reset a pool's breaker, drain a machine, kill or retry a "
        "job, and ask why a job is still pending or why a pool has the machines it has.",
    )
    url = store_url(store)

    def with_store(action: Callable[[SqlStore], T]) -> T:
        try:
            opened = open_store(url)
            try:
                return action(opened)
            finally:
                opened.close()
        except StoreError as exc:
            raise ToolError(str(exc)) from exc

    @server.tool()
    def pools_list() -> list[dict[str, Any]]:
        """Every pool: desired machines, machines by state, queue, breaker, pause, cost."""
        found: list[dict[str, Any]] = _admin("GET", "/pools")
        return found

    @server.tool()
    def pools_get(name: str) -> dict[str, Any]:
        """One pool in full: its machines, open incidents and cost."""
        found: dict[str, Any] = _admin("GET", f"/pools/{_part(name)}")
        return found

    @server.tool()
    def pools_pause(name: str) -> dict[str, Any]:
        """Pause a pool: it creates and binds nothing new (running jobs finish)."""
        found: dict[str, Any] = _admin("POST", f"/pools/{_part(name)}/pause")
        return found

    @server.tool()
    def pools_resume(name: str) -> dict[str, Any]:
        """Resume a paused pool."""
        found: dict[str, Any] = _admin("POST", f"/pools/{_part(name)}/resume")
        return found

    @server.tool()
    def pools_reset(name: str) -> dict[str, Any]:
        """Close a pool's breaker after fixing what failed its boots (resume does not)."""
        found: dict[str, Any] = _admin("POST", f"/pools/{_part(name)}/reset")
        return found

    @server.tool()
    def schedules_pause(name: str) -> dict[str, Any]:
        """Pause a schedule: it makes no fire until resumed (no restart or deploy resumes it)."""
        found: dict[str, Any] = _admin("POST", f"/schedules/{_part(name)}/pause")
        return found

    @server.tool()
    def schedules_resume(name: str) -> dict[str, Any]:
        """Resume a paused schedule; the fire times it missed while paused are not made."""
        found: dict[str, Any] = _admin("POST", f"/schedules/{_part(name)}/resume")
        return found

    @server.tool()
    def machines_drain(machine: str) -> dict[str, Any]:
        """Drain a ready machine: no new job, its jobs finish, then it is destroyed."""
        found: dict[str, Any] = _admin("POST", f"/machines/{_part(machine)}/drain")
        return found

    @server.tool()
    def jobs_list(status: Status | None = None, limit: int = 100) -> list[dict[str, Any]]:
        """Jobs, newest first, optionally of one status."""
        return with_store(
            lambda store: [job.as_json() for job in store.list_jobs(status, max(1, limit))]
        )

    @server.tool()
    def jobs_policy(
        table: str,
        concurrency: int | None = None,
        max_retries: int | None = None,
        retry_strategy: Literal["linear", "exponential"] | None = None,
        no_cap: bool = False,
    ) -> dict[str, Any]:
        """A table's job policy; given a value, retune it live (the next tick admits by it):
        concurrency (at most this many at once; no_cap=true lifts the cap), max_retries and
        retry_strategy of new jobs that set none."""
        changes: dict[str, Any] = {"concurrency": None} if no_cap else {}
        given = {"max_retries": max_retries, "retry_strategy": retry_strategy}
        changes.update({k: v for k, v in given.items() if v is not None})
        if concurrency is not None:
            changes["concurrency"] = concurrency
        return with_store(lambda store: _retune(store, table, changes))

    @server.tool()
    def jobs_get(job_id: str) -> dict[str, Any]:
        """One job with every field: payload, result, errors, attempts."""
        return with_store(lambda store: store.get(job_id).as_json())

    @server.tool()
    def jobs_kill(job_id: str) -> dict[str, Any]:
        """Kill a job: a waiting one fails now; a running one is stopped on its machine."""
        return with_store(lambda store: store.kill(job_id, time.time()).as_json())

    @server.tool()
    def jobs_retry(job_id: str) -> dict[str, Any]:
        """Run a finished job again (its history is kept)."""
        return with_store(lambda store: store.retry(job_id, time.time()).as_json())

    @server.tool()
    def explain_job(job_id: str) -> dict[str, Any]:
        """Why a job is still pending: each cause with a code, a message and its figures."""
        found: dict[str, Any] = _admin("GET", f"/jobs/{_part(job_id)}/explain")
        return found

    @server.tool()
    def explain_pool(name: str) -> dict[str, Any]:
        """Why a pool has the machines it has: the sizing rule with its numbers, and the
        plan's reason for each machine."""
        found: dict[str, Any] = _admin("GET", f"/pools/{_part(name)}/explain")
        return found

    return server


def _retune(store: SqlStore, table: str, changes: dict[str, Any]) -> dict[str, Any]:
    """A table a controller wrote the policy of, retuned (when ``changes``); its policy."""
    kept = store.policies.read()
    if table not in kept:
        known = ", ".join(kept) or "none yet: a controller writes them when it starts"
        raise ToolError(f"no job policy for table {table!r} (tables: {known})")
    if changes:
        kept[table] = store.policies.retune(table, changes, time.time(), "MCP")
    return policy_json(table, kept[table], TablePolicy())
