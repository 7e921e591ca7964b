"""``shepherd queues``: each backend's admission — its capacity, its queues (quota, what they
may borrow, weight), what each uses and who waits — and changes to them while jobs run
(shepherd/scheduling.py; the backend's scheduler workflow applies a change at once)."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from shepherd.cli.common import EXIT_INVALID, fail, run, shepherd
from shepherd.cli.render import console, print_json
from shepherd.scheduling import Capacity, QueueConfig, SchedulerState, pools_problem

app = typer.Typer(
    help="Admission queues: each backend's capacity, queues, quotas and who waits.",
    invoke_without_command=True,
)
JsonOption = Annotated[bool, typer.Option("--json", help="Print data as JSON.")]


@app.callback()
def show(ctx: typer.Context, as_json: JsonOption = False) -> None:
    """Every backend's capacity and queues: quota, borrow limit, weight, slots in use (and
    borrowed), jobs waiting, preemptions."""
    if ctx.invoked_subcommand is not None:
        return

    async def go() -> None:
        states = await (await shepherd()).schedulers()
        if as_json:
            print_json([s.model_dump(mode="json") for s in states])
            return
        if not states:
            console.print(
                "no backend admits jobs in Shepherd yet (a backend profile declares its "
                "capacity with SHEPHERD_BACKEND_<NAME>_SLOTS; its scheduler starts with its "
                "first job)"
            )
            return
        for state in states:
            _show(state)

    run(go())


def _show(state: SchedulerState) -> None:
    used = state.usage()
    counts = state.waiting_in()
    held = len(state.holders)
    caps = (
        f", capabilities {', '.join(state.capacity.capabilities)}"
        if state.capacity.capabilities
        else ""
    )
    if state.capacity.pools:
        in_pool = state.pool_usage()
        caps += "; pools " + ", ".join(
            f"{p} {in_pool.get(p, 0)} of {n}" for p, n in sorted(state.capacity.pools.items())
        )
    console.print(
        f"[bold]{state.backend}[/bold]: {held} of {state.capacity.slots} slots held{caps}; "
        f"{sum(counts.values())} waiting; {state.admitted_total} admitted; preemptions "
        + (", ".join(f"{k} {v}" for k, v in sorted(state.preemptions.items())) or "none")
    )
    names = sorted({*state.queues, *used, *counts})
    table = Table("queue", "quota", "borrow limit", "weight", "in use", "borrowed", "waiting")
    for name in names:
        q = state.queue(name)
        use = used.get(name, 0)
        waiting = counts.get(name, 0)
        declared = "" if name in state.queues else " (undeclared)"
        table.add_row(
            name + declared,
            str(q.quota),
            str(q.borrow_limit),
            f"{q.weight:g}",
            str(use),
            str(max(0, use - q.quota)),
            str(waiting),
        )
    console.print(table)


@app.command("set")
def set_queue(
    backend: str,
    name: str,
    quota: Annotated[int, typer.Option(min=0, help="Slots the queue is entitled to.")],
    borrow_limit: Annotated[
        int, typer.Option("--borrow-limit", min=0, help="Slots beyond its quota it may borrow.")
    ] = 0,
    weight: Annotated[float, typer.Option(help="Its share of contended capacity.")] = 1.0,
) -> None:
    """Declare or change a queue of BACKEND; it takes effect at once (jobs waiting in it are
    admitted as the new quota allows)."""
    try:
        queue = QueueConfig(name=name, quota=quota, borrow_limit=borrow_limit, weight=weight)
    except ValueError as exc:
        fail(str(exc).splitlines()[0], EXIT_INVALID)

    async def go() -> None:
        state = await (await shepherd()).configure_queue(backend, queue)
        _show(state)

    run(go())


@app.command("remove")
def remove_queue(backend: str, name: str) -> None:
    """Remove a queue's declaration (its jobs then only borrow what others leave idle)."""

    async def go() -> None:
        _show(await (await shepherd()).remove_queue(backend, name))

    run(go())


@app.command("capacity")
def set_capacity(
    backend: str,
    slots: Annotated[int, typer.Option(min=0, help="Trainers its jobs may hold at once.")],
    capabilities: Annotated[
        str | None, typer.Option(help="Comma-separated capability tags (default: unchanged).")
    ] = None,
    pool: Annotated[
        list[str] | None,
        typer.Option(
            help="A pool's slots, NAME=N (an accelerator type or a training shape; repeat for "
            "each pool; N=0 closes it; 'none' removes every pool). Default: unchanged."
        ),
    ] = None,
) -> None:
    """Change BACKEND's capacity while jobs run (fewer slots: nobody is stopped; new
    admissions wait until use falls below it)."""
    try:
        pools = _parse_pools(pool)
    except ValueError as exc:
        fail(f"--pool: {exc}", EXIT_INVALID)

    async def go() -> None:
        sh = await shepherd()
        current = await sh.scheduler(backend)
        tags = (
            current.capacity.capabilities
            if capabilities is None
            else [t.strip() for t in capabilities.split(",") if t.strip()]
        )
        given = current.capacity.pools if pools is None else pools
        capacity = Capacity(slots=slots, capabilities=tags, pools=given)
        _show(await sh.set_capacity(backend, capacity))

    run(go())


def _parse_pools(given: list[str] | None) -> dict[str, int] | None:
    """``--pool NAME=N`` options -> pools (None: none given, unchanged; ``none``: no pools)."""
    if not given:
        return None
    if given == ["none"]:
        return {}
    pools: dict[str, int] = {}
    for item in given:
        name, sep, count = item.partition("=")
        if not sep or not name.strip() or not count.strip().isdigit():
            raise ValueError(f"{item!r} is not NAME=N (N a whole number of slots)")
        pools[name.strip()] = int(count)
    if problem := pools_problem(pools):
        raise ValueError(problem.removeprefix("pools: "))
    return pools
