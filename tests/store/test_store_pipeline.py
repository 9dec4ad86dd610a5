"""PostgreSQL: the statements of one ``transaction()`` travel in a pipeline. What is sent
before a read goes with it, and what is read after the COMMIT goes with the COMMIT. A poll
that carries results and claims work costs two round trips, not one for each of BEGIN, the
machine, its running jobs, the results, the renewals, the claim and COMMIT.

The round trips are counted on the wire. A proxy on loopback sits between the store and the
server and counts the client's Sync and Query messages: each one waits for the server's
ReadyForQuery, so each is a round trip. The connection has no TLS, so the proxy can read the
messages.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

import psycopg
import pytest

from sp00ky_infra.config.loader import load_config
from sp00ky_infra.controller.agents import Agents
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.protocol import FinishedAttempt, PollRequest, RunningAttempt
from sp00ky_infra.controller.settings import ControllerSettings
from sp00ky_infra.controller.state import Deployment
from sp00ky_infra.store import NewJob, SqlStore, StoreError, open_store
from sp00ky_infra.store.postgres import PostgresStore
from tests.controller.test_controller_executor import Recording
from tests.controllers import add_ready_machine, backend_app, leading, project
from tests.store.test_store_contract import LEASE, T0, claim_one, new

MACHINE = "render-m1"


class CountingProxy:
    """A TCP proxy on 127.0.0.1 in front of the PostgreSQL server that counts round trips:
    the server's answers to new requests (its bytes that follow bytes of the client's, in
    however many segments, count once). A pipeline's statements and its Sync, sent together,
    are one; each statement sent and read alone is one."""

    def __init__(self, host: str, port: int) -> None:
        self.upstream = (host, port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.trips = 0
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = [self.listener]
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            server = socket.create_connection(self.upstream)
            for each in (client, server):
                each.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._sockets += [client, server]
            asked = threading.Event()  # the client sent bytes the server has not answered
            threading.Thread(target=self._pipe, args=(client, server, asked), daemon=True).start()
            threading.Thread(
                target=self._answers, args=(server, client, asked), daemon=True
            ).start()

    def _pipe(self, client: socket.socket, server: socket.socket, asked: threading.Event) -> None:
        try:
            while data := client.recv(65536):
                asked.set()
                server.sendall(data)
        except OSError:
            pass
        finally:
            server.close()

    def _answers(
        self, server: socket.socket, client: socket.socket, asked: threading.Event
    ) -> None:
        try:
            while data := server.recv(65536):
                if asked.is_set():
                    asked.clear()
                    with self._lock:
                        self.trips += 1
                client.sendall(data)
        except OSError:
            pass
        finally:
            client.close()

    def count(self) -> int:
        with self._lock:
            return self.trips

    def close(self) -> None:
        for each in self._sockets:
            each.close()


@pytest.fixture
def proxied(postgres_url: str) -> Iterator[tuple[PostgresStore, CountingProxy]]:
    """A store on ``postgres_url`` through a CountingProxy (no TLS: the proxy reads the
    messages), migrated, and the proxy."""
    parts = urlsplit(postgres_url)
    proxy = CountingProxy(parts.hostname or "127.0.0.1", parts.port or 5432)
    netloc = parts.netloc.rsplit("@", 1)
    address = f"127.0.0.1:{proxy.port}"
    netloc_text = f"{netloc[0]}@{address}" if len(netloc) == 2 else address
    separator = "&" if parts.query else ""
    query = f"{parts.query}{separator}sslmode=disable&gssencmode=disable"
    url = urlunsplit((parts.scheme, netloc_text, parts.path, query, ""))
    store = open_store(url)
    assert isinstance(store, PostgresStore)
    store.migrate()
    try:
        yield store, proxy
    finally:
        store.close()
        proxy.close()


def _trips(proxy: CountingProxy, since: int) -> int:
    return proxy.count() - since


def test_statements_sent_before_a_read_travel_with_it_and_the_claim_with_the_commit(
    proxied: tuple[PostgresStore, CountingProxy],
) -> None:
    store, proxy = proxied
    store.machines.add("m1", "render", "local", "r1", 4, T0)
    for _ in range(5):
        store.enqueue(new(), T0)
    running = [claim_one(store, T0) for _ in range(3)]
    store.get(running[0].id)  # the thread's connection is open: no connect is counted
    before = proxy.count()
    with store.transaction():
        machine = store.machines.send_get("m1")
        on_it = store.send_running_on("m1")  # read before the results that follow it
        done = store.send_complete_many(
            [(job.id, job.attempt or "", {"n": 1}) for job in running[:2]], T0 + 1, machine="m1"
        )
        assert machine.result().name == "m1"
        assert {job.id for job in on_it.result()} == {job.id for job in running}
        assert [each.status for each in done.result()] == ["success", "success"]
        assert _trips(proxy, before) == 1  # BEGIN, the plans' setting and the three
        renewed = store.send_renew([(running[2].id, running[2].attempt or "")], T0 + 1, LEASE)
        claimed = store.send_claim("render_job", 2, "c", T0 + 1, LEASE, machine="m1")
        assert _trips(proxy, before) == 1  # sent with the COMMIT, not before
    assert _trips(proxy, before) == 2
    assert renewed.result() == {running[2].id}
    jobs = claimed.result()
    assert len(jobs) == 2 and all(job.machine == "m1" for job in jobs)
    # committed: another connection sees the results and the claim
    with psycopg.connect(store.url) as other:
        rows = other.execute(
            "SELECT status, count(*) FROM jobs GROUP BY status ORDER BY status"
        ).fetchall()
    assert rows == [("processing", 3), ("success", 2)]


def test_an_error_in_the_pipeline_undoes_the_transaction_and_leaves_the_connection_usable(
    proxied: tuple[PostgresStore, CountingProxy],
) -> None:
    store, _ = proxied
    job = store.enqueue(new(), T0)
    running = claim_one(store, T0)
    with pytest.raises(psycopg.errors.DivisionByZero), store.transaction():
        store.send_complete_many([(job.id, running.attempt or "", {"n": 1})], T0 + 1)
        store.send("SELECT 1 / 0").result()
    assert store.get(job.id).status == "processing"
    # a Python error after statements were sent (and never read) undoes them too
    with pytest.raises(RuntimeError), store.transaction():
        store.send_complete_many([(job.id, running.attempt or "", {"n": 1})], T0 + 1)
        raise RuntimeError("the poll failed")
    assert store.get(job.id).status == "processing"
    store.complete(job.id, running.attempt or "", {"n": 2}, T0 + 2)
    assert store.get(job.id).result == {"n": 2}


def test_a_write_inside_the_pipelined_transaction_is_undone_alone(
    proxied: tuple[PostgresStore, CountingProxy],
) -> None:
    store, _ = proxied
    first, second = store.enqueue(new(), T0), store.enqueue(new(), T0)
    with store.transaction():
        with pytest.raises(psycopg.errors.DivisionByZero), store.write() as cur:
            cur.execute("UPDATE jobs SET priority = 7 WHERE id = ?", (first.id,))
            cur.execute("SELECT 1 / 0")
        store.send_claim("render_job", 1, "c", T0, LEASE, machine="m1")
    assert store.get(first.id).priority == first.priority  # its savepoint rolled back
    assert {store.get(first.id).status, store.get(second.id).status} == {"processing", "pending"}


@pytest.fixture
def controller(
    tmp_path: Path, proxied: tuple[PostgresStore, CountingProxy]
) -> Iterator[Controller]:
    """A leading controller on the proxied store, one ready machine of four slots whose agent
    holds the session ``tok``."""
    store, _ = proxied
    app = backend_app("render", "render_job", tmp_path / "log")
    config = load_config(project(tmp_path, {"render": {"min": 1, "slots": 4}}, {"renderer": app}))
    settings = ControllerSettings(secret="s", state_dir=str(tmp_path))
    revision = Deployment.of(config, settings.pool).revisions["render"]
    add_ready_machine(store, MACHINE, revision, 4, "tok", time.time())
    with leading(Controller(settings, config, store, Recording(delivers_join_token=True))) as made:
        yield made


def _enqueue(store: SqlStore, count: int) -> None:
    news = [
        NewJob("renderer", "render_job", "/render", {"n": n}, pool="render") for n in range(count)
    ]
    store.enqueue_many(news, time.time())


def test_a_poll_with_results_renewals_and_work_makes_two_round_trips(
    controller: Controller, proxied: tuple[PostgresStore, CountingProxy]
) -> None:
    store, proxy = proxied
    _enqueue(store, 10)
    first = Agents(controller).poll(
        MACHINE, "tok", PollRequest(free_slots=4)
    )  # the busy period opens
    assert len(first.assignments) == 4
    done, still = first.assignments[:3], first.assignments[3]
    before = proxy.count()
    reply = Agents(controller).poll(
        MACHINE,
        "tok",
        PollRequest(
            free_slots=3,
            running=[RunningAttempt(job=still.job, attempt=still.attempt)],
            results=[
                FinishedAttempt(job=work.job, attempt=work.attempt, status="success")
                for work in done
            ],
        ),
    )
    assert _trips(proxy, before) == 2
    assert [ack.job_status for ack in reply.results] == ["success"] * 3
    assert reply.stop == []  # the running job's lease was renewed
    assert len(reply.assignments) == 3
    assert {store.get(work.job).status for work in reply.assignments} == {"processing"}
    assert {store.get(work.job).status for work in done} == {"success"}


def test_a_poll_of_another_session_records_nothing(
    controller: Controller, proxied: tuple[PostgresStore, CountingProxy]
) -> None:
    store, _ = proxied
    _enqueue(store, 2)
    work = Agents(controller).poll(MACHINE, "tok", PollRequest(free_slots=1)).assignments[0]
    finished = FinishedAttempt(job=work.job, attempt=work.attempt, status="success")
    with pytest.raises(Exception, match="session is not machine"):
        Agents(controller).poll(MACHINE, "stolen", PollRequest(free_slots=1, results=[finished]))
    assert store.get(work.job).status == "processing"  # the result sent first was undone
    assert store.counts()["pending"] == 1  # and nothing was claimed
    reply = Agents(controller).poll(MACHINE, "tok", PollRequest(free_slots=1, results=[finished]))
    assert [ack.job_status for ack in reply.results] == ["success"]


def test_a_transaction_inside_another_is_a_savepoint_of_it(
    proxied: tuple[PostgresStore, CountingProxy],
) -> None:
    store, _ = proxied
    first, second = store.enqueue(new(), T0), store.enqueue(new(), T0)
    with pytest.raises(RuntimeError), store.transaction():
        with store.transaction():
            claim_one(store, T0)  # the inner block ends well: no COMMIT of its own
        raise RuntimeError("the outer one fails after the inner one ended")
    assert {store.get(first.id).status, store.get(second.id).status} == {"pending"}
    with store.transaction():
        with pytest.raises(RuntimeError), store.transaction():
            claim_one(store, T0)
            raise RuntimeError("the inner one fails: undone alone")
        claim_one(store, T0)
    assert {store.get(first.id).status, store.get(second.id).status} == {"pending", "processing"}


def test_an_error_that_surfaces_with_the_commit_rolls_back_and_leaves_the_connection_usable(
    proxied: tuple[PostgresStore, CountingProxy],
) -> None:
    store, _ = proxied
    job = store.enqueue(new(), T0)
    with pytest.raises(psycopg.errors.DivisionByZero), store.transaction():
        claim_one(store, T0)
        store.send("SELECT 1 / 0")  # never read: its error comes with the COMMIT
    assert store.get(job.id).status == "pending"  # the same connection, out of that transaction
    with store.transaction():
        claimed = store.send_claim("render_job", 1, "c", T0, LEASE, machine="m1")
    assert [each.id for each in claimed.result()] == [job.id]


def test_a_savepoint_whose_unread_statement_fails_is_undone_alone(
    proxied: tuple[PostgresStore, CountingProxy],
) -> None:
    store, _ = proxied
    job = store.enqueue(new(), T0)
    with store.transaction():
        with pytest.raises(psycopg.errors.DivisionByZero), store.write():
            store.send("SELECT 1 / 0")  # never read: its error comes with the RELEASE
        claimed = store.send_claim("render_job", 1, "c", T0, LEASE, machine="m1")
    assert [each.id for each in claimed.result()] == [job.id]
    assert store.get(job.id).status == "processing"


def test_a_transaction_that_went_on_after_a_failed_statement_raises_instead_of_committing(
    proxied: tuple[PostgresStore, CountingProxy],
) -> None:
    store, _ = proxied
    job = store.enqueue(new(), T0)
    # the caught error left the pipeline aborted: the COMMIT is refused with it
    with pytest.raises(psycopg.errors.PipelineAborted), store.transaction():
        claim_one(store, T0)
        with pytest.raises(psycopg.errors.DivisionByZero):
            store.send("SELECT 1 / 0").result()  # caught: the block goes on
    assert store.get(job.id).status == "pending"
    # synced after it (the transaction aborted, the pipeline not): the COMMIT is a ROLLBACK
    with pytest.raises(StoreError, match="rolled back"), store.transaction():
        claim_one(store, T0)
        with pytest.raises(psycopg.errors.DivisionByZero):
            store.send("SELECT 1 / 0").result()
        store._pipeline().sync()  # type: ignore[union-attr]
    assert store.get(job.id).status == "pending"


def test_a_transaction_inside_a_write_is_a_savepoint_of_it(
    proxied: tuple[PostgresStore, CountingProxy],
) -> None:
    store, _ = proxied
    job = store.enqueue(new(), T0)
    with pytest.raises(RuntimeError), store.write():
        with store.transaction():
            claim_one(store, T0)
        raise RuntimeError("the outer write fails after the inner transaction ended")
    assert store.get(job.id).status == "pending"
