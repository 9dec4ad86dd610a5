"""`sp00ky-infra mcp`: the admin operations as MCP tools over stdio, driven by the official
SDK's own client (stdio_client + ClientSession) against a running controller."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

from mcp import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.types import TextContent

from sp00ky_infra.client import Client
from tests.controllers import (
    ADMIN_TOKEN,
    ControllerProcess,
    backend_app,
    project,
    running_controller,
    wait_for,
)

TOOLS = {
    "pools_list", "pools_get", "pools_pause", "pools_resume", "machines_drain", "jobs_list",
    "jobs_get", "jobs_kill", "jobs_retry", "explain_job", "explain_pool", "schedules_pause",
    "schedules_resume", "jobs_policy", "pools_reset",
}  # fmt: skip


def _value(result: Any) -> Any:
    """A tool result's JSON: its structured content (a list comes wrapped as {result: ...})."""
    assert not result.is_error, result.content
    found = result.structured_content
    if isinstance(found, dict) and set(found) == {"result"}:
        return found["result"]
    return found if found is not None else json.loads(_text(result))


def _text(result: Any) -> str:
    [block] = result.content
    assert isinstance(block, TextContent)
    return block.text


async def _session(controller: ControllerProcess, store_url: str, tmp: Path, job_id: str) -> None:
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "sp00ky_infra", "mcp"],
        env={
            "SPKY_ADMIN_URL": controller.admin_url,
            "SPKY_ADMIN_TOKEN": ADMIN_TOKEN,
            "SPKY_STORE": store_url,
        },
        cwd=str(tmp),
    )
    async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        listed = await session.list_tools()
        assert {tool.name for tool in listed.tools} == TOOLS

        async def call(tool: str, **arguments: Any) -> Any:
            return _value(await session.call_tool(tool, arguments))

        pools = await call("pools_list")
        assert [pool["name"] for pool in pools] == ["render"]
        machine = (await call("pools_get", name="render"))["machine_list"][0]["name"]
        assert (await call("pools_pause", name="render"))["paused"] is True
        assert (await call("pools_resume", name="render"))["paused"] is False
        reset = await call("pools_reset", name="render")
        assert reset["breaker"] == {"open": False, "failures": 0, "open_until": None}
        assert reset["breaker_before"]["open"] is False

        why = await call("explain_job", job_id=job_id)
        assert [cause["code"] for cause in why["causes"]][:1] == ["delayed"]
        assert (await call("explain_pool", name="render"))["desired"] == 1
        assert [job["id"] for job in await call("jobs_list", status="pending")] == [job_id]
        assert (await call("jobs_get", job_id=job_id))["payload"] == {"gameId": "later"}
        killed = await call("jobs_kill", job_id=job_id)
        assert killed["status"] == "failed" and killed["errors"][-1]["code"] == "cancelled"
        assert (await call("jobs_retry", job_id=job_id))["status"] == "pending"

        retuned = await call("jobs_policy", table="render_job", concurrency=4, max_retries=1)
        assert (retuned["concurrency"], retuned["max_retries"]) == (4, 1)
        assert retuned["updated_by"] == "MCP"
        assert (await call("jobs_policy", table="render_job", no_cap=True))["concurrency"] is None
        refused = await session.call_tool("jobs_policy", {"table": "render_job", "max_retries": -1})
        assert refused.is_error and "max_retries -1: 0 or more" in _text(refused)

        assert (await call("machines_drain", machine=machine))["state"] == "draining"
        refused = await session.call_tool("pools_get", {"name": "nope"})
        assert refused.is_error and "no pool 'nope' (pools: render)" in _text(refused)
        refused = await session.call_tool("schedules_pause", {"name": "nightly"})
        assert refused.is_error and "no schedule 'nightly' (schedules: none)" in _text(refused)


def test_mcp_tools_over_stdio_with_the_sdk_client(tmp_path: Path) -> None:
    app = backend_app("render", "render_job", tmp_path / "backend.jsonl")
    config = project(tmp_path, {"render": {"min": 1}}, {"renderer": app})
    store_url = f"sqlite:///{tmp_path}/state.db"
    client = Client(store_url, config)
    try:
        with running_controller(tmp_path / "controller", config, store_url) as controller:
            wait_for(
                lambda: controller.pool("render")["machines"].get("ready") == 1,
                what="the pool's machine ready",
            )
            job = client.run("renderer", "/render", {"gameId": "later"}, delay=600_000)
            asyncio.run(_session(controller, store_url, tmp_path, job.id))
    finally:
        client.close()
