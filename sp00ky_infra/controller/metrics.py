"""/metrics on the admin listener: what the controller measured (``measures.py``) and what
it reads at scrape time, each from what it already holds or one indexed read per pool.

Read off the scrape's path (``QueueReadings``): the queue counts, whose cost grows with the
backlog (a count walks every index entry of the queue), are read by a thread of their
own every QUEUE_READ_SECONDS while someone scrapes, so a scrape serves counts at most that old
(the first scrape reads them itself):
- ``sp00ky_jobs{pool,status}``: pending_due, pending_delayed, processing (index ranges)
- ``sp00ky_oldest_pending_seconds{pool}``: since the longest-waiting due job was due (from the
  oldest due time read, so it grows between readings as it should)

Read at scrape time:
- ``sp00ky_machines{pool,state}``: live machines by state (every state, zeros included)
- ``sp00ky_pool_desired_machines{pool}``: what the last tick's plan wanted
- ``sp00ky_pool_machine_seconds_total{pool}``, ``sp00ky_pool_cost_euros_total{pool}``,
  ``sp00ky_pool_idle_euros_total{pool}``: every machine the pool ever had (costs.py); a pool
  whose server type has no known price has no euros sample at all (a 0 would be summed as a
  real zero, a NaN breaks sum() and rate()), and ``sp00ky_pool_price_known{pool,server_type}``
  is 0 for it (1 otherwise), so an alert can name it;
  ``sp00ky_pool_price_hourly_euros{pool,server_type,source,date}``: the hourly price the euros
  are computed at and where it came from (sp00ky.yml, Hetzner's API as last read, or the
  dated table; ``date`` empty for sp00ky.yml's), for a priced pool only
- ``sp00ky_pool_idle_paid_machines{pool}``, ``sp00ky_pool_idle_paid_euros{pool}``: the idle
  surplus machines the last tick's plan kept only because their started hour is paid
  (``policy.plan.kept_paid``, over the view that plan was made from), and what the rest of
  those hours is worth at the pool's price (no sample when unknown)
- ``sp00ky_pool_snapshot_gigabytes{pool}``, ``sp00ky_pool_snapshot_monthly_euros{pool}``: the
  pool's snapshots as last listed from Hetzner's API (``pricing.py``), their size and what
  they cost a month; 0 for a pool listed with none, no sample when never listed
- ``sp00ky_breaker_open{pool}``, ``sp00ky_pool_paused{pool}``, ``sp00ky_leader``
- ``sp00ky_pool_info{pool,provider,provisioner,declared_provider}``: 1 per pool; what its
  machines run on as served, what makes them, and what sp00ky.yml declares (admin.py)
- ``sp00ky_servers_swept_total{reason}``: the project's servers the sweep deleted because no
  live machine row held them (sweep.py), by reason (zeros included)

The Hetzner API budget, as this process spent and saw it (``hetzner/budget.py``):
- ``sp00ky_hetzner_requests_total{caller,method}``: requests the controller sent (heartbeat,
  prices, bake); a ``pulumi up``'s are sent by the engine's provider host, another process,
  and show in what remains
- ``sp00ky_hetzner_ratelimit_remaining``, ``sp00ky_hetzner_ratelimit_limit``: the project's
  hourly budget as the last answer told it (no sample before the first answer), and
  ``sp00ky_hetzner_budget_low``: 1 while it is below the reserve kept for the guardian
"""

from __future__ import annotations

import threading
import time
import weakref
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import suppress

from prometheus_client import generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from sp00ky_infra.controller.admin import provider_of
from sp00ky_infra.controller.core import Controller
from sp00ky_infra.controller.costs import FREE, cached_prices, pool_price
from sp00ky_infra.controller.sweep import REASONS
from sp00ky_infra.hetzner import HcloudError
from sp00ky_infra.hetzner.budget import LEDGER, Budget
from sp00ky_infra.policy.cost import pool_bill
from sp00ky_infra.policy.machines import LIVE_STATES
from sp00ky_infra.policy.plan import kept_paid
from sp00ky_infra.store.jobs import QueueStats
from sp00ky_infra.store.prices import PriceReading
from sp00ky_infra.store.snapshots import SnapshotTable

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
QUEUE_READ_SECONDS = 5.0  # how old a scrape's queue counts may be
QUEUE_READ_IDLE_SECONDS = 120.0  # the reading thread stops when nobody scraped for this long


class QueueReadings:
    """The pools' queue counts, read every QUEUE_READ_SECONDS by a thread of their own while
    scrapes come, so that a scrape's cost does not grow with the backlog."""

    def __init__(
        self, read: Callable[[str], QueueStats], clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._read = read
        self._clock = clock
        self._found: dict[str, QueueStats] = {}
        self._asked = clock()
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def get(self, pools: list[str]) -> dict[str, QueueStats]:
        with self._lock:
            self._asked = self._clock()
            missing = [pool for pool in pools if pool not in self._found]
        for pool in missing:  # the first scrape of a pool reads it
            stats = self._read(pool)
            with self._lock:
                self._found[pool] = stats
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._refresh, name="metrics-queue", daemon=True
                )
                self._thread.start()
            return {pool: self._found[pool] for pool in pools}

    def _refresh(self) -> None:
        while True:
            time.sleep(QUEUE_READ_SECONDS)
            with self._lock:
                if self._clock() - self._asked > QUEUE_READ_IDLE_SECONDS:
                    self._thread = None
                    return
                pools = list(self._found)
            for pool in pools:
                try:
                    stats = self._read(pool)
                except Exception:  # the store is down: serve the last counts, try again later
                    continue
                with self._lock:
                    self._found[pool] = stats


_READINGS: weakref.WeakKeyDictionary[Controller, QueueReadings] = weakref.WeakKeyDictionary()


def queue_readings(controller: Controller) -> QueueReadings:
    """The controller's queue readings, made at its first scrape."""
    found = _READINGS.get(controller)
    if found is None:
        ref = weakref.ref(controller)

        def read(pool: str) -> QueueStats:
            alive = ref()
            if alive is None:
                raise LookupError("the controller is gone")
            return alive.store.queue_stats(alive.table_of(pool), alive.clock())

        found = _READINGS.setdefault(controller, QueueReadings(read))
    return found


PROVIDER_LABELS = ("provider", "provisioner", "declared_provider")


class ControllerCollector(Collector):
    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    def collect(self) -> Iterator[Metric]:
        controller = self.controller
        store = controller.store
        now = controller.clock()
        jobs = GaugeMetricFamily("sp00ky_jobs", "Jobs by status.", labels=["pool", "status"])
        oldest = GaugeMetricFamily(
            "sp00ky_oldest_pending_seconds",
            "Since the longest-waiting due job was due (0 when none waits).",
            labels=["pool"],
        )
        machines = GaugeMetricFamily(
            "sp00ky_machines", "Live machines by state.", labels=["pool", "state"]
        )
        desired = GaugeMetricFamily(
            "sp00ky_pool_desired_machines",
            "Machines the last tick's plan wanted.",
            labels=["pool"],
        )
        breaker = GaugeMetricFamily(
            "sp00ky_breaker_open", "1 while the pool's breaker stops boots.", labels=["pool"]
        )
        paused = GaugeMetricFamily("sp00ky_pool_paused", "1 while paused.", labels=["pool"])
        info = GaugeMetricFamily(
            "sp00ky_pool_info",
            "1 per pool: its provider as served, its provisioner, its provider in sp00ky.yml.",
            labels=["pool", *PROVIDER_LABELS],
        )
        by_state = Counter((m.pool, m.state) for m in store.machines.live())
        plans = controller.plans
        queues = queue_readings(controller).get(list(controller.pools))
        for name in controller.pools:
            stats = queues[name]
            jobs.add_metric([name, "pending_due"], stats.due)
            jobs.add_metric([name, "pending_delayed"], stats.delayed)
            jobs.add_metric([name, "processing"], stats.processing)
            waited = 0.0 if stats.oldest_due is None else max(now - stats.oldest_due, 0.0)
            oldest.add_metric([name], waited)
            for state in LIVE_STATES:
                machines.add_metric([name, state], by_state.get((name, state), 0))
            if name in plans:
                desired.add_metric([name], plans[name].desired)
            flags = controller.pool_states.get(name)
            breaker.add_metric([name], 1.0 if flags.breaker.is_open(now) else 0.0)
            paused.add_metric([name], 1.0 if flags.paused else 0.0)
            served = provider_of(controller, name)
            info.add_metric([name, *(served[label] for label in PROVIDER_LABELS)], 1.0)
        leader = GaugeMetricFamily("sp00ky_leader", "1 while this controller leads its store.")
        leader.add_metric([], 1.0 if controller.leader else 0.0)
        yield from (jobs, oldest, machines, desired)
        yield from self._costs(now)
        yield from (breaker, paused, info, leader)
        yield self._swept()

    def _swept(self) -> Metric:
        swept = CounterMetricFamily(
            "sp00ky_servers_swept",
            "Servers of the project the sweep deleted: no live machine row held them.",
            labels=["reason"],
        )
        counts = self.controller.server_sweep.counts
        for reason in REASONS:
            swept.add_metric([reason], counts.get(reason, 0))
        return swept

    def _costs(self, now: float) -> Iterator[Metric]:
        """Each pool's machine time, bill and price, the price as ``costs.priced`` finds it."""
        controller = self.controller
        seconds = CounterMetricFamily(
            "sp00ky_pool_machine_seconds",
            "Machine time, creation to destruction, of every machine the pool had.",
            labels=["pool"],
        )
        euros = CounterMetricFamily(
            "sp00ky_pool_cost_euros",
            "The pool's machines' bill (per started hour, capped monthly) at its server "
            "type's price.",
            labels=["pool"],
        )
        idle = CounterMetricFamily(
            "sp00ky_pool_idle_euros",
            "The share of the bill spent with no job running.",
            labels=["pool"],
        )
        known = GaugeMetricFamily(
            "sp00ky_pool_price_known",
            "1 if the pool's server type has a known price, 0 if its euros are unknown (no "
            "sample): give one under prices: in sp00ky.yml.",
            labels=["pool", "server_type"],
        )
        hourly = GaugeMetricFamily(
            "sp00ky_pool_price_hourly_euros",
            "EUR per started hour the pool's euros are computed at, and where that price came "
            "from (source, date).",
            labels=["pool", "server_type", "source", "date"],
        )
        listed = cached_prices(controller.store, controller.config)
        for name, pool in controller.pools.items():
            lifetimes = controller.store.machines.lifetimes(name)
            lives = [(life.seconds(now), life.busy(now)) for life in lifetimes]
            found = pool_price(controller.config, name, listed)
            bill = pool_bill(found.price if found is not None else FREE, lives)
            seconds.add_metric([name], bill.machine_seconds)
            known.add_metric([name, pool.machine.type], float(found is not None))
            if found is not None:
                euros.add_metric([name], bill.euros)
                idle.add_metric([name], bill.idle_euros)
                where = [name, pool.machine.type, found.price.source, found.date or ""]
                hourly.add_metric(where, found.price.hourly)
        yield from (seconds, euros, idle, known, hourly)
        yield from self._paid(now, listed)
        yield from self._snapshots()

    def _snapshots(self) -> Iterator[Metric]:
        """Each pool's snapshots as last listed; no sample at all before the first listing."""
        controller = self.controller
        size = GaugeMetricFamily(
            "sp00ky_pool_snapshot_gigabytes",
            "GB of the pool's snapshots (what Hetzner bills), as last listed.",
            labels=["pool"],
        )
        monthly = GaugeMetricFamily(
            "sp00ky_pool_snapshot_monthly_euros",
            "What the pool's snapshots cost a month (net EUR a GB and month x their GB).",
            labels=["pool"],
        )
        listed = SnapshotTable(controller.store).read()
        for name in controller.pools:
            if listed is not None:
                mine = listed.pool(name)
                size.add_metric([name], mine.gigabytes)
                monthly.add_metric([name], mine.monthly_euros)
        yield from (size, monthly)

    def _paid(self, now: float, listed: PriceReading | None) -> Iterator[Metric]:
        """Each pool's idle machines kept for their paid hour, and what it has left."""
        controller = self.controller
        paid = GaugeMetricFamily(
            "sp00ky_pool_idle_paid_machines",
            "Idle surplus machines kept until their started hour ends (keepPaidHours).",
            labels=["pool"],
        )
        paid_euros = GaugeMetricFamily(
            "sp00ky_pool_idle_paid_euros",
            "What the rest of those machines' paid hours is worth: work they may still take "
            "at no extra cost.",
            labels=["pool"],
        )
        kept = _kept_paid(controller, now)
        for name in controller.pools:
            left = kept.get(name, [])
            paid.add_metric([name], len(left))
            found = pool_price(controller.config, name, listed)
            if found is not None:
                paid_euros.add_metric([name], sum(share * found.price.hourly for share in left))
        yield from (paid, paid_euros)


def _kept_paid(controller: Controller, now: float) -> dict[str, list[float]]:
    """Each pool's machines the last tick kept idle for their paid hour (from the view its
    plan was made from: no read of the store), as the share of an hour each has left; none
    before the first tick, or when no machine is billed."""
    plans = controller.plans
    kept: dict[str, list[float]] = {}
    for name, view in controller.planned_views.items():
        plan = plans.get(name)
        if plan is None or view.billing is None:
            continue
        billing = view.billing
        kept[view.name] = [
            (billing.paid_until(machine.created_at, now) - now) / billing.hour
            for machine in kept_paid(view, plan, now)
        ]
    return kept


class HetznerBudgetCollector(Collector):
    """The Hetzner API requests this process sent, and the budget last seen."""

    def __init__(self, budget: Budget = LEDGER) -> None:
        self.budget = budget

    def collect(self) -> Iterator[Metric]:
        sent = CounterMetricFamily(
            "sp00ky_hetzner_requests",
            "Hetzner API requests sent by this controller, by caller and method.",
            labels=["caller", "method"],
        )
        for (caller, method), count in sorted(self.budget.sent().items()):
            sent.add_metric([caller, method], count)
        remaining = GaugeMetricFamily(
            "sp00ky_hetzner_ratelimit_remaining",
            "Requests left of the project's hourly Hetzner API budget, as last answered.",
        )
        limit = GaugeMetricFamily(
            "sp00ky_hetzner_ratelimit_limit", "The project's Hetzner API requests an hour."
        )
        low = GaugeMetricFamily(
            "sp00ky_hetzner_budget_low",
            "1 while the budget left is below the reserve kept for the guardian: new machines "
            "and drains of idle ones wait.",
        )
        last = self.budget.last
        if last is not None:
            remaining.add_metric([], last.remaining)
            limit.add_metric([], last.limit)
            with suppress(HcloudError):  # a bad SPKY_HETZNER_RESERVE: the tick's log says so
                low.add_metric([], 1.0 if self.budget.low() else 0.0)
        yield from (sent, remaining, limit, low)


def exposition(controller: Controller) -> bytes:
    """The text format (0.0.4, what every Prometheus reads): the measures, then the
    scrape-time reads."""
    measured = generate_latest(controller.measures.registry)
    return (
        measured
        + generate_latest(ControllerCollector(controller))
        + generate_latest(HetznerBudgetCollector())
    )
