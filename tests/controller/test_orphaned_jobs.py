"""A deploy that removes a backend, or moves it to another pool, cancels the jobs it left
waiting at once, each with why, instead of letting them wait for their queue timeout; the
jobs of the backends it kept wait on (a real controller restarted with a changed sp00ky.yml,
on SQLite and PostgreSQL)."""

from __future__ import annotations

from pathlib import Path

from sp00ky_infra.client import Client
from sp00ky_infra.store import Job
from tests.controllers import backend_app, deploys, wait_for

PAUSED = {"min": 0, "autoscale": True, "max": 1}


def _cancelled(client: Client, jobs: list[Job]) -> list[Job] | None:
    found = [client.store.get(job.id) for job in jobs]
    return found if all(job.status == "failed" for job in found) else None


def test_a_deploy_cancels_the_waiting_jobs_of_a_removed_or_moved_backend(
    tmp_path: Path, store_url: str
) -> None:
    renderer = backend_app("render", "render_job", tmp_path / "render.jsonl")
    thumbs = backend_app("thumb", "thumb_job", tmp_path / "thumb.jsonl")
    with deploys(tmp_path, store_url) as deploy:
        first = deploy.start(
            {"render": PAUSED, "thumb": PAUSED}, {"renderer": renderer, "thumbs": thumbs}
        )
        wait_for(first.leader, what="leadership")
        for pool in ("render", "thumb"):  # nothing runs: the jobs wait
            assert first.admin("POST", f"/pools/{pool}/pause").status_code == 200
        client = Client(store_url, first.config)
        try:
            rendering = [client.run("renderer", "/render", {"gameId": f"r{i}"}) for i in range(3)]
            thumbing = [client.run("thumbs", "/render", {"gameId": f"t{i}"}) for i in range(2)]

            second = deploy.start({"render": PAUSED}, {"renderer": renderer})  # thumbs removed
            wait_for(second.leader, what="the new controller leading")
            gone = wait_for(lambda: _cancelled(client, thumbing), what="thumbs' jobs cancelled")
            for job in gone:
                assert job.errors[-1]["code"] == "cancelled"
                assert job.errors[-1]["reason"] == (
                    "backend thumbs was removed from sp00ky.yml; cancelled while waiting"
                )
            assert {client.store.get(j.id).status for j in rendering} == {"pending"}

            moved = {**renderer, "runOn": {"pool": "gpu"}}
            third = deploy.start({"gpu": PAUSED}, {"renderer": moved})
            wait_for(third.leader, what="the third controller leading")
            left = wait_for(lambda: _cancelled(client, rendering), what="render's jobs cancelled")
            assert {job.errors[-1]["reason"] for job in left} == {
                "backend renderer no longer runs on pool render (it runs on pool gpu now); "
                "cancelled while waiting"
            }
            assert "event=jobs_cancelled backend=renderer pool=render" in third.log()
        finally:
            client.close()
