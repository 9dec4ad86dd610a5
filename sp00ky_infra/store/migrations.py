"""Versioned schema migrations, applied in order at start (each once, in its own transaction).

The SQL is written once for both back ends: types and partial indexes that SQLite and
PostgreSQL both accept. Add a migration by appending to MIGRATIONS; never edit an old one.
"""

from __future__ import annotations

from dataclasses import dataclass

FAN_OUT_AND_PAUSE = 14  # the schedules' fan-out and pause migration's number


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    description: str
    statements: tuple[str, ...]
    sqlite: tuple[str, ...] = ()  # then these, on SQLite only (triggers: each dialect's own)
    postgres: tuple[str, ...] = ()  # or these, on PostgreSQL only


MIGRATIONS: tuple[Migration, ...] = (
    Migration(
        1,
        "jobs as outbox rows, and hourly counters of pruned jobs",
        (
            """
            CREATE TABLE jobs (
                id TEXT PRIMARY KEY,
                backend TEXT NOT NULL,
                tbl TEXT NOT NULL,
                path TEXT NOT NULL,
                payload TEXT NOT NULL,
                status TEXT NOT NULL
                    CHECK (status IN ('pending', 'processing', 'success', 'failed')),
                retries INTEGER NOT NULL DEFAULT 0,
                max_retries INTEGER NOT NULL DEFAULT 3 CHECK (max_retries >= 0),
                retry_strategy TEXT NOT NULL DEFAULT 'linear'
                    CHECK (retry_strategy IN ('linear', 'exponential')),
                delay_ms BIGINT NOT NULL DEFAULT 0,
                timeout DOUBLE PRECISION,
                errors TEXT NOT NULL DEFAULT '[]',
                result TEXT,
                assignee TEXT,
                assigned_to TEXT,
                created_at DOUBLE PRECISION NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL,
                pool TEXT,
                priority INTEGER NOT NULL DEFAULT 0,
                slots INTEGER NOT NULL DEFAULT 1 CHECK (slots >= 1),
                run_after DOUBLE PRECISION NOT NULL,
                queue_timeout DOUBLE PRECISION,
                queue_deadline DOUBLE PRECISION,
                max_job_duration DOUBLE PRECISION,
                attempt TEXT,
                attempt_number INTEGER NOT NULL DEFAULT 0,
                machine TEXT,
                lease_expires_at DOUBLE PRECISION,
                deadline DOUBLE PRECISION,
                cancel_requested INTEGER NOT NULL DEFAULT 0,
                started_at DOUBLE PRECISION,
                finished_at DOUBLE PRECISION,
                attempts TEXT NOT NULL DEFAULT '[]'
            )
            """,
            # Each status change rewrites every index (it is never a HOT update), so there are
            # few: the queue, queue deadlines, the running jobs (few: at most the slots in
            # use, so the sweep, kills and in-flight counts scan them all), finished jobs for
            # retention, and creation time for listings.
            "CREATE INDEX jobs_queue ON jobs (tbl, priority DESC, created_at, id)"
            " WHERE status = 'pending'",
            # (status, queue_deadline), not (queue_deadline): without statistics SQLite would
            # rather walk jobs_finished by status, every pending row, than a one-column index.
            "CREATE INDEX jobs_queue_deadline ON jobs (status, queue_deadline)"
            " WHERE status = 'pending' AND queue_deadline IS NOT NULL",
            "CREATE INDEX jobs_running ON jobs (tbl) WHERE status = 'processing'",
            "CREATE INDEX jobs_finished ON jobs (status, tbl, finished_at)",
            "CREATE INDEX jobs_recent ON jobs (created_at)",
            """
            CREATE TABLE job_counters (
                tbl TEXT NOT NULL,
                hour BIGINT NOT NULL,
                outcome TEXT NOT NULL,
                count BIGINT NOT NULL,
                PRIMARY KEY (tbl, hour, outcome)
            )
            """,
        ),
    ),
    Migration(
        2,
        "machines, pool state (pause, breaker), incidents, used join tokens",
        (
            """
            CREATE TABLE machines (
                name TEXT PRIMARY KEY,
                pool TEXT NOT NULL,
                provider TEXT NOT NULL,
                state TEXT NOT NULL CHECK (state IN
                    ('requested', 'booting', 'ready', 'draining', 'failed', 'destroyed')),
                revision TEXT NOT NULL,
                slots INTEGER NOT NULL,
                created_at DOUBLE PRECISION NOT NULL,
                updated_at DOUBLE PRECISION NOT NULL,
                joined_at DOUBLE PRECISION,
                ready_at DOUBLE PRECISION,
                last_seen_at DOUBLE PRECISION,
                idle_since DOUBLE PRECISION,
                drain_reason TEXT,
                drained INTEGER NOT NULL DEFAULT 0,
                failed_reason TEXT,
                destroyed_at DOUBLE PRECISION,
                provider_id TEXT,
                provider_state TEXT,
                session_hash TEXT
            )
            """,
            "CREATE INDEX machines_live ON machines (pool) WHERE state <> 'destroyed'",
            """
            CREATE TABLE pool_state (
                pool TEXT PRIMARY KEY,
                paused INTEGER NOT NULL DEFAULT 0,
                breaker_failures INTEGER NOT NULL DEFAULT 0,
                breaker_opened INTEGER NOT NULL DEFAULT 0,
                breaker_open_until DOUBLE PRECISION,
                updated_at DOUBLE PRECISION NOT NULL
            )
            """,
            """
            CREATE TABLE incidents (
                id TEXT PRIMARY KEY,
                pool TEXT NOT NULL,
                kind TEXT NOT NULL,
                message TEXT NOT NULL,
                opened_at DOUBLE PRECISION NOT NULL,
                closed_at DOUBLE PRECISION
            )
            """,
            "CREATE INDEX incidents_open ON incidents (pool, kind) WHERE closed_at IS NULL",
            """
            CREATE TABLE join_nonces (
                nonce TEXT PRIMARY KEY,
                machine TEXT NOT NULL,
                used_at DOUBLE PRECISION NOT NULL
            )
            """,
        ),
    ),
    Migration(
        3,
        "machine credentials: a rebooted machine's agent rejoins with the secret of its first join",
        ("ALTER TABLE machines ADD COLUMN credential_hash TEXT",),
    ),
    Migration(
        4,
        "what /metrics and the cost read cheaply: pending jobs by due time, machines' busy time",
        (
            # Pending due and delayed, and the oldest due job, of a table: a range of this
            # index each (a scrape with 100,000 jobs waiting reads no row).
            "CREATE INDEX jobs_pending_due ON jobs (tbl, run_after) WHERE status = 'pending'",
            # The time a machine ran at least one job (idle euros are the rest of its life):
            # the busy period open since busy_since, and the closed ones summed.
            "ALTER TABLE machines ADD COLUMN busy_seconds DOUBLE PRECISION NOT NULL DEFAULT 0",
            "ALTER TABLE machines ADD COLUMN busy_since DOUBLE PRECISION",
        ),
    ),
    Migration(
        5,
        "schedules: each one's fire cursor, its runs keyed by (schedule, fire time), counters",
        (
            # When a schedule was first seen (it never fires for times before) and the time of
            # its last fire (catch-up counts from there). Kept apart from the runs, which
            # retention deletes.
            """
            CREATE TABLE schedule_state (
                schedule TEXT PRIMARY KEY,
                first_seen_at DOUBLE PRECISION NOT NULL,
                last_fire_at DOUBLE PRECISION
            )
            """,
            # One row per fire; the unique key makes each fire happen once, whichever
            # controller (a leader, the one that took over from it) makes it. A run's status
            # follows its job's until it ends; skipped runs have no job.
            """
            CREATE TABLE schedule_runs (
                id TEXT PRIMARY KEY,
                schedule TEXT NOT NULL,
                fire_at DOUBLE PRECISION NOT NULL,
                fired_at DOUBLE PRECISION NOT NULL,
                status TEXT NOT NULL CHECK (status IN ('pending', 'processing', 'success',
                    'failed', 'killed', 'skipped', 'replaced')),
                job_id TEXT,
                finished_at DOUBLE PRECISION,
                UNIQUE (schedule, fire_at)
            )
            """,
            "CREATE INDEX schedule_runs_open ON schedule_runs (schedule)"
            " WHERE status IN ('pending', 'processing')",
            "CREATE INDEX schedule_runs_finished ON schedule_runs (status, schedule, finished_at)",
            """
            CREATE TABLE schedule_counters (
                schedule TEXT NOT NULL,
                hour BIGINT NOT NULL,
                outcome TEXT NOT NULL,
                count BIGINT NOT NULL,
                PRIMARY KEY (schedule, hour, outcome)
            )
            """,
        ),
    ),
    Migration(
        6,
        "what the tick reads at a flat cost: running jobs by machine, by lease expiry, by deadline",
        (
            # Each leads with status (partial on the running jobs: a few entries a slot in use,
            # whatever the backlog) so that SQLite, without statistics, picks them over
            # jobs_finished, which holds every row and would have it read the running rows
            # one by one from a table of any size.
            # The busy slots of each machine, read from the index alone (the tick), and the
            # jobs a machine runs (a poll's running_on).
            "CREATE INDEX jobs_running_on ON jobs (status, machine, tbl, slots)"
            " WHERE status = 'processing'",
            # The sweep: a range each, the leases run out and the attempts past their deadline.
            "CREATE INDEX jobs_lease ON jobs (status, lease_expires_at)"
            " WHERE status = 'processing'",
            "CREATE INDEX jobs_deadline ON jobs (status, deadline)"
            " WHERE status = 'processing' AND deadline IS NOT NULL",
        ),
    ),
    Migration(
        7,
        "each machine's busy slots kept on its row by the database; the tick's indexes",
        (
            # A machine's busy slots: the slots of the jobs running on it (any table), kept
            # by triggers on jobs in the transaction that moves a job in or out of
            # 'processing' (claim, result, sweep, kill, requeue, delete), whatever the path,
            # and recomputed when a machine row is inserted: no writer can let it drift.
            "ALTER TABLE machines ADD COLUMN busy_slots INTEGER NOT NULL DEFAULT 0",
            "UPDATE machines SET busy_slots = (SELECT coalesce(sum(j.slots), 0) FROM jobs j "
            "WHERE j.status = 'processing' AND j.machine = machines.name)",
            # The tick (store.tick) reads each pool's ready machines counted (their number,
            # busy slots, idle ones) from machines_ready alone (state in it too: SQLite reads
            # from an index alone only the columns it holds), and seeks the ones a plan must
            # decide about (not ready; maybe silent, past their lifetime, on another
            # revision, their idle clock to start or stop): a range of a few entries each.
            "CREATE INDEX machines_ready ON machines (pool, state, busy_slots, idle_since)"
            " WHERE state = 'ready'",
            "CREATE INDEX machines_ready_seen ON machines (pool, last_seen_at)"
            " WHERE state = 'ready'",
            "CREATE INDEX machines_ready_born ON machines (pool, created_at) WHERE state = 'ready'",
            "CREATE INDEX machines_ready_revision ON machines (pool, revision)"
            " WHERE state = 'ready'",
            "CREATE INDEX machines_ready_clock ON machines (pool)"
            " WHERE state = 'ready' AND busy_slots > 0 AND idle_since IS NOT NULL",
            "CREATE INDEX machines_unready ON machines (pool)"
            " WHERE state <> 'ready' AND state <> 'destroyed'",
        ),
        sqlite=(
            # A trigger a side of the move, each with its own WHEN: a claim runs the one that
            # adds, a result the one that takes away, and a job that stays where it was
            # (a renewal, a rewrite of the same row) neither.
            """
            CREATE TRIGGER jobs_busy_from AFTER UPDATE OF status, machine, slots ON jobs
            WHEN OLD.status = 'processing' AND NOT (NEW.status = 'processing'
                AND OLD.machine IS NEW.machine AND OLD.slots = NEW.slots)
            BEGIN
                UPDATE machines SET busy_slots = busy_slots - OLD.slots WHERE name = OLD.machine;
            END
            """,
            """
            CREATE TRIGGER jobs_busy_to AFTER UPDATE OF status, machine, slots ON jobs
            WHEN NEW.status = 'processing' AND NOT (OLD.status = 'processing'
                AND OLD.machine IS NEW.machine AND OLD.slots = NEW.slots)
            BEGIN
                UPDATE machines SET busy_slots = busy_slots + NEW.slots WHERE name = NEW.machine;
            END
            """,
            """
            CREATE TRIGGER jobs_busy_insert AFTER INSERT ON jobs
            WHEN NEW.status = 'processing'
            BEGIN
                UPDATE machines SET busy_slots = busy_slots + NEW.slots WHERE name = NEW.machine;
            END
            """,
            """
            CREATE TRIGGER jobs_busy_delete AFTER DELETE ON jobs
            WHEN OLD.status = 'processing'
            BEGIN
                UPDATE machines SET busy_slots = busy_slots - OLD.slots WHERE name = OLD.machine;
            END
            """,
            """
            CREATE TRIGGER machines_busy_insert AFTER INSERT ON machines
            BEGIN
                UPDATE machines SET busy_slots = (SELECT coalesce(sum(j.slots), 0) FROM jobs j
                    WHERE j.status = 'processing' AND j.machine = NEW.name)
                WHERE name = NEW.name;
            END
            """,
        ),
        postgres=(
            # A row trigger for inserts and deletes (the WHEN skips any row not running
            # before calling anything), a statement trigger for updates: one UPDATE of the
            # machines a statement, not one a job (a claim or a batch of results moves many).
            """
            CREATE FUNCTION jobs_busy() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                IF TG_OP = 'INSERT' THEN
                    UPDATE machines SET busy_slots = busy_slots + NEW.slots
                        WHERE name = NEW.machine;
                ELSE
                    UPDATE machines SET busy_slots = busy_slots - OLD.slots
                        WHERE name = OLD.machine;
                END IF;
                RETURN NULL;
            END
            $$
            """,
            """
            CREATE TRIGGER jobs_busy_insert AFTER INSERT ON jobs
            FOR EACH ROW WHEN (NEW.status = 'processing') EXECUTE FUNCTION jobs_busy()
            """,
            """
            CREATE TRIGGER jobs_busy_delete AFTER DELETE ON jobs
            FOR EACH ROW WHEN (OLD.status = 'processing') EXECUTE FUNCTION jobs_busy()
            """,
            """
            CREATE FUNCTION jobs_busy_moved() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                UPDATE machines m SET busy_slots = m.busy_slots + d.slots
                FROM (
                    SELECT machine, sum(slots) AS slots FROM (
                        SELECT machine, slots FROM moved_to WHERE status = 'processing'
                        UNION ALL
                        SELECT machine, -slots FROM moved_from WHERE status = 'processing'
                    ) AS c
                    WHERE machine IS NOT NULL GROUP BY machine HAVING sum(slots) <> 0
                ) AS d
                WHERE m.name = d.machine;
                RETURN NULL;
            END
            $$
            """,
            """
            CREATE TRIGGER jobs_busy_update AFTER UPDATE ON jobs
            REFERENCING OLD TABLE AS moved_from NEW TABLE AS moved_to
            FOR EACH STATEMENT EXECUTE FUNCTION jobs_busy_moved()
            """,
            """
            CREATE FUNCTION machines_busy() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                UPDATE machines SET busy_slots = (SELECT coalesce(sum(j.slots), 0) FROM jobs j
                    WHERE j.status = 'processing' AND j.machine = NEW.name)
                WHERE name = NEW.name;
                RETURN NULL;
            END
            $$
            """,
            """
            CREATE TRIGGER machines_busy_insert AFTER INSERT ON machines
            FOR EACH ROW EXECUTE FUNCTION machines_busy()
            """,
        ),
    ),
    Migration(
        8,
        "the wide jobs (slots > 1) waiting, in admission order: whether a claim may share its "
        "queue's lock (PostgreSQL)",
        (),
        postgres=(
            "CREATE INDEX jobs_pending_wide ON jobs (tbl, priority DESC, created_at, id)"
            " WHERE status = 'pending' AND slots > 1",
        ),
    ),
    Migration(
        9,
        "a running attempt's history entry is its row's columns, not the last entry of attempts",
        # The claim no longer appends the entry, nor a result closes it (rows: job_from_row
        # makes it of the columns); a running row written before holds it: taken off.
        (),
        sqlite=(
            "UPDATE jobs SET attempts = json_remove(attempts, '$[#-1]') "
            "WHERE status = 'processing' AND attempts <> '[]' "
            "AND json_extract(attempts, '$[#-1].id') = attempt",
        ),
        postgres=(
            "UPDATE jobs SET attempts = (attempts::jsonb - (-1))::text "
            "WHERE status = 'processing' AND attempts <> '[]' "
            "AND attempts::jsonb -> -1 ->> 'id' = attempt",
        ),
    ),
    Migration(
        10,
        "prices read from the provider's API, with the day they were read",
        (
            # The last complete reading of Hetzner's GET /pricing: each server type's net
            # price per location, and the primary IPv4's (kind 'primary_ipv4', name 'ipv4').
            # A reading replaces the whole table at once; a failed one leaves it as it was.
            """
            CREATE TABLE provider_prices (
                kind TEXT NOT NULL CHECK (kind IN ('server_type', 'primary_ipv4')),
                name TEXT NOT NULL,
                location TEXT NOT NULL,
                hourly DOUBLE PRECISION NOT NULL,
                monthly DOUBLE PRECISION NOT NULL,
                read_on TEXT NOT NULL,
                read_at DOUBLE PRECISION NOT NULL,
                source TEXT NOT NULL,
                PRIMARY KEY (kind, name, location)
            )
            """,
        ),
    ),
    Migration(
        11,
        "when a machine failed, kept apart from its last update (which its destroy moves on)",
        (
            "ALTER TABLE machines ADD COLUMN failed_at DOUBLE PRECISION",
            # the rows that failed before: their last update is the best there is
            "UPDATE machines SET failed_at = updated_at WHERE failed_reason IS NOT NULL",
        ),
    ),
    Migration(
        12,
        "each outbox table's job policy, retuned live (store/policies.py)",
        (
            """
            CREATE TABLE job_policies (
                tbl TEXT PRIMARY KEY,
                concurrency INTEGER CHECK (concurrency IS NULL OR concurrency >= 1),
                max_retries INTEGER CHECK (max_retries IS NULL OR max_retries >= 0),
                retry_strategy TEXT
                    CHECK (retry_strategy IS NULL OR retry_strategy IN ('linear', 'exponential')),
                declared TEXT,
                updated_at DOUBLE PRECISION NOT NULL,
                updated_by TEXT NOT NULL
            )
            """,
        ),
    ),
    Migration(
        13,
        "the project's snapshots as last listed from the provider's API, with the price of a GB",
        (
            # The last complete listing (GET /images, the project's snapshots): one row of
            # when it was read and at what net price of a GB a month, and one per snapshot.
            # A listing replaces both tables at once; a failed one leaves them as they were.
            """
            CREATE TABLE snapshot_readings (
                per_gb_month DOUBLE PRECISION NOT NULL,
                read_on TEXT NOT NULL,
                read_at DOUBLE PRECISION NOT NULL,
                source TEXT NOT NULL
            )
            """,
            """
            CREATE TABLE pool_snapshots (
                image_id BIGINT PRIMARY KEY,
                pool TEXT NOT NULL,
                gigabytes DOUBLE PRECISION,
                created_at DOUBLE PRECISION NOT NULL
            )
            """,
        ),
    ),
    Migration(
        FAN_OUT_AND_PAUSE,
        "schedules: a fan-out's runs keyed by (schedule, fire time, row key); pausing",
        (
            # A paused schedule makes no fire; its resume is where its cursor starts again.
            "ALTER TABLE schedule_state ADD COLUMN paused_at DOUBLE PRECISION",
            "ALTER TABLE schedule_state ADD COLUMN resumed_at DOUBLE PRECISION",
        ),
        # The runs' key gains the row's key (item; '' for a schedule without forEach), and a
        # run says why its fire failed (error). SQLite changes a UNIQUE by remaking the table.
        sqlite=(
            """
            CREATE TABLE schedule_runs_keyed (
                id TEXT PRIMARY KEY,
                schedule TEXT NOT NULL,
                fire_at DOUBLE PRECISION NOT NULL,
                fired_at DOUBLE PRECISION NOT NULL,
                status TEXT NOT NULL CHECK (status IN ('pending', 'processing', 'success',
                    'failed', 'killed', 'skipped', 'replaced')),
                job_id TEXT,
                finished_at DOUBLE PRECISION,
                item TEXT NOT NULL DEFAULT '',
                error TEXT,
                UNIQUE (schedule, fire_at, item)
            )
            """,
            "INSERT INTO schedule_runs_keyed (id, schedule, fire_at, fired_at, status, job_id, "
            "finished_at) SELECT id, schedule, fire_at, fired_at, status, job_id, finished_at "
            "FROM schedule_runs",
            "DROP TABLE schedule_runs",
            "ALTER TABLE schedule_runs_keyed RENAME TO schedule_runs",
            "CREATE INDEX schedule_runs_open ON schedule_runs (schedule)"
            " WHERE status IN ('pending', 'processing')",
            "CREATE INDEX schedule_runs_finished ON schedule_runs (status, schedule, finished_at)",
        ),
        postgres=(
            "ALTER TABLE schedule_runs ADD COLUMN item TEXT NOT NULL DEFAULT ''",
            "ALTER TABLE schedule_runs ADD COLUMN error TEXT",
            "ALTER TABLE schedule_runs DROP CONSTRAINT schedule_runs_schedule_fire_at_key",
            "ALTER TABLE schedule_runs ADD CONSTRAINT schedule_runs_fire_item "
            "UNIQUE (schedule, fire_at, item)",
        ),
    ),
    Migration(
        15,
        "the agent archive each machine's agent runs (its sha256), as its last join said",
        ("ALTER TABLE machines ADD COLUMN agent TEXT",),
    ),
    Migration(
        16,
        "each pool's capacity as admission holds it, a lowered one after its old queue drains",
        (
            """
            CREATE TABLE pool_capacity (
                pool TEXT PRIMARY KEY,
                capacity INTEGER NOT NULL CHECK (capacity >= 0),
                draining_from INTEGER,
                changed_at DOUBLE PRECISION,
                updated_at DOUBLE PRECISION NOT NULL
            )
            """,
        ),
    ),
)
