"""A worker's Prometheus endpoints, as Kueue exports its own.

Two, each switched on by its address in the worker's environment:

* ``SHEPHERD_METRICS=host:port`` — Shepherd's admission, with ``prometheus_client``: for each
  backend that admits jobs (its scheduler's state, read every ``REFRESH`` seconds): capacity
  and slots held, per queue its quota, slots in use and borrowed, jobs waiting and admitted,
  the seconds its jobs held slots and waited for them (``shepherd_trainer_seconds``,
  ``shepherd_queue_wait_seconds``), and preemptions by cause. Every
  worker reports the same figures (they are the scheduler's): aggregate with ``max``.
* ``SHEPHERD_TEMPORAL_METRICS=host:port`` — the Temporal SDK's own (workflow and activity
  task latencies, slots, polls; ``temporalio.runtime.PrometheusConfig``), and what the job
  workflows measure as they go, through the SDK's metric meter (workflows/measures.py):
  recoveries by reason, the scheduler's preemptions included (``shepherd_recoveries_total``),
  readiness lag (RUNNING to the first training call: ``shepherd_readiness_lag_seconds``),
  and the time each job waited for admission (``shepherd_admission_wait_seconds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import structlog
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from temporalio.client import Client
from temporalio.runtime import PrometheusConfig, Runtime, TelemetryConfig

from shepherd.scheduling import SchedulerState

log = structlog.stdlib.get_logger("shepherd.metrics")

#: How often the admission figures are read from the schedulers: a scrape every 15 s sees
#: figures at most this old, for one list and one query per backend.
REFRESH = 10.0
#: The environment variables that switch the two endpoints on (and set REFRESH).
ENV = "SHEPHERD_METRICS"
REFRESH_ENV = "SHEPHERD_METRICS_REFRESH"
TEMPORAL_ENV = "SHEPHERD_TEMPORAL_METRICS"


def temporal_runtime() -> Runtime | None:
    """A Temporal runtime exporting the SDK's metrics (and the workflows' own, from its
    metric meter) at ``SHEPHERD_TEMPORAL_METRICS`` (None: the default runtime, none)."""
    where = os.environ.get(TEMPORAL_ENV)
    if not where:
        return None
    host, port = address(where)
    return Runtime(
        telemetry=TelemetryConfig(metrics=PrometheusConfig(bind_address=f"{host}:{port}"))
    )


def address(value: str) -> tuple[str, int]:
    """``host:port`` (or ``:port``, all interfaces) of a metrics endpoint."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit():
        raise SystemExit(f"a metrics address is host:port, not {value!r}")
    return host or "0.0.0.0", int(port)


class AdmissionCollector:
    """Shepherd's admission figures, from the schedulers' last read state."""

    def __init__(self) -> None:
        self.states: list[SchedulerState] = []

    def collect(self) -> Iterator[Metric]:
        def gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        capacity = gauge(
            "shepherd_capacity_slots", "Trainers a backend's jobs may hold.", ["backend"]
        )
        held = gauge("shepherd_slots_held", "Slots held now.", ["backend"])
        pool_slots = gauge(
            "shepherd_pool_slots",
            "A backend's slots of one accelerator type or training shape.",
            ["backend", "pool"],
        )
        pool_held = gauge(
            "shepherd_pool_slots_held", "A pool's slots held now.", ["backend", "pool"]
        )
        quota = gauge("shepherd_queue_quota_slots", "A queue's quota.", ["backend", "queue"])
        in_use = gauge(
            "shepherd_queue_slots_in_use", "Slots a queue's jobs hold.", ["backend", "queue"]
        )
        borrowed = gauge(
            "shepherd_queue_slots_borrowed",
            "Slots held beyond the queue's quota.",
            ["backend", "queue"],
        )
        waiting = gauge(
            "shepherd_jobs_waiting", "Jobs waiting for admission.", ["backend", "queue"]
        )
        admitted = CounterMetricFamily(
            "shepherd_jobs_admitted", "Jobs admitted to a slot.", labels=["backend", "queue"]
        )
        held_s = CounterMetricFamily(
            "shepherd_trainer_seconds",
            "Seconds a queue's jobs held slots (given back, and held now).",
            labels=["backend", "queue"],
        )
        waited_s = CounterMetricFamily(
            # (Not shepherd_admission_wait_seconds: the workflows' histogram of each wait.)
            "shepherd_queue_wait_seconds",
            "Seconds a queue's admitted jobs waited for their slot.",
            labels=["backend", "queue"],
        )
        preempted = CounterMetricFamily(
            "shepherd_scheduler_preemptions",
            "Jobs asked to make way, by cause (priority, reclaim).",
            labels=["backend", "cause"],
        )
        now = datetime.now(UTC)
        for s in self.states:
            b = s.backend
            used = s.usage()
            holding: dict[str, float] = {}
            for h in s.holders.values():
                seconds = (now - h.granted_at).total_seconds()
                holding[h.queue] = holding.get(h.queue, 0.0) + max(0.0, seconds)
            capacity.add_metric([b], s.capacity.slots)
            held.add_metric([b], len(s.holders))
            in_pool = s.pool_usage()
            for pool, n in sorted(s.capacity.pools.items()):
                pool_slots.add_metric([b, pool], n)
                pool_held.add_metric([b, pool], in_pool.get(pool, 0))
            counts = s.waiting_in()
            queues = sorted({*s.queues, *used, *counts, *s.admitted})
            for name in queues:
                q = s.queue(name)
                quota.add_metric([b, name], q.quota)
                in_use.add_metric([b, name], used.get(name, 0))
                borrowed.add_metric([b, name], max(0, used.get(name, 0) - q.quota))
                waiting.add_metric([b, name], counts.get(name, 0))
                admitted.add_metric([b, name], s.admitted.get(name, 0))
                waited_s.add_metric([b, name], s.waited_seconds.get(name, 0.0))
                held_s.add_metric([b, name], s.held_seconds.get(name, 0.0) + holding.get(name, 0.0))
            for cause, n in sorted(s.preemptions.items()):
                preempted.add_metric([b, cause], n)
        yield from (
            capacity,
            held,
            pool_slots,
            pool_held,
            quota,
            in_use,
            borrowed,
            waiting,
            admitted,
            held_s,
            waited_s,
            preempted,
        )


async def _refresh(client: Client, collector: AdmissionCollector, every: float) -> None:
    from shepherd.client import Shepherd

    sh = Shepherd(client, task_queue="")
    while True:
        try:
            collector.states = await sh.schedulers()
        except Exception as exc:  # noqa: BLE001 - the last figures stay; a scrape still answers
            log.warning("metrics.refresh_failed", error=str(exc)[:300])
        await asyncio.sleep(every)


@contextlib.asynccontextmanager
async def serving(client: Client, where: str | None, *, every: float | None = None) -> Any:
    """Shepherd's metrics endpoint at ``where`` (None: none) while the block runs."""
    every = every or float(os.environ.get(REFRESH_ENV) or REFRESH)
    if not where:
        yield None
        return
    host, port = address(where)
    registry = CollectorRegistry()
    collector = AdmissionCollector()
    registry.register(collector)
    server, thread = start_http_server(port, host, registry=registry)
    log.info("metrics.serving", address=f"{host}:{server.server_port}")
    task = asyncio.create_task(_refresh(client, collector, every))
    try:
        yield server
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        server.shutdown()
        thread.join(timeout=5)
