"""Checks at submission against the live system, made before a workflow starts: the
workflow id is free, a worker serves the spec's backend, and no live job or sweep claims the
same output model id.

Model ids. Two live jobs promoting to the same model id would both train to the end and the
second would fail at promotion, so a job (or a sweep's ``promote_best``) *claims* its model
id from submission until it ends: the claim is the ``ShepherdOutputModel`` search attribute,
set when the workflow starts and gone from the query once it closes (continue-as-new keeps
it). A visibility query alone would let two simultaneous submissions both see no claim, so
the check and the start happen under a short lock: a workflow whose id is derived from the
model id, on a task queue no worker polls (it never runs; Temporal's one-running-workflow-
per-id rule is the mutex, strongly consistent where visibility is not). The lock is held
until the new workflow shows in the visibility query, so whoever takes it next sees the
claim; it times out by itself if a submitter dies holding it. A schedule's run knows its
model id only once its templates are filled, so it claims the id itself when it starts,
through this same check and lock (activities/claims.py).

Workers. A submission is refused where no worker polls its task queue (the job would wait
for ever). A worker advertises the backend profiles it knows and the loops registered with
it in its Temporal identity (:func:`worker_identity`); a submission asks the task queue's
pollers (one cheap RPC) and refuses a backend or loop none of them has. Workers that
advertise nothing (older ones) say nothing, and the job is accepted: the workflow's first
activity (activities/preflight.py) then fails it before provisioning, naming the field.
Training shapes are not checked here: resolving one needs the platform's key, which only
workers hold; the workflow resolves the shape first of all, before any trainer exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator, Iterable
from datetime import timedelta
from typing import Any

from temporalio.api.enums.v1 import TaskQueueType
from temporalio.api.taskqueue.v1 import TaskQueue
from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from shepherd import search_attributes as sa

#: No worker polls this queue: claim locks are workflows that never run.
CLAIM_QUEUE = "shepherd-claims"
CLAIM_LOCK_TYPE = "ShepherdClaimLock"
#: A lock normally lives for one submission (well under a second); a dead submitter's
#: lock expires after this.
LOCK_TIMEOUT = timedelta(seconds=15)
#: How long a submission waits for a busy lock (another submission of the same model id).
LOCK_WAIT = timedelta(seconds=20)
#: How long the lock is kept while waiting for the new workflow to show in visibility
#: (milliseconds on SQL visibility, about a second with Elasticsearch).
VISIBLE_WAIT = timedelta(seconds=10)
_BACKENDS = " backends="
#: A worker that has just started is listed as a poller once its first poll reaches the
#: server (well under a second): a queue is looked at again for this long before a
#: submission is refused for having no worker.
POLLER_GRACE = timedelta(seconds=2)
#: A worker says it is ready (``--ready-file``) once the server lists its pollers, which a
#: submission checks: on a loaded machine the first poll took longer than POLLER_GRACE
#: (a submission right after "ready" was refused, test_worker_crash). Bounded, so a worker
#: whose server never lists pollers still starts (it says ready without it).
LISTED_WITHIN = timedelta(seconds=30)


class SubmissionRefused(ValueError):
    """The spec is valid but cannot start now; ``field`` names what to change."""

    def __init__(self, field: str, message: str) -> None:
        self.field = field
        super().__init__(f"{field}: {message}")


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


# ---------------------------------------------------------------------- workflow ids


async def id_refusal(client: Client, workflow_id: str, *, rerun: bool) -> SubmissionRefused | None:
    """Why ``workflow_id`` cannot be used now (None: it can)."""
    try:
        desc = await client.get_workflow_handle(workflow_id).describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    if desc.status == WorkflowExecutionStatus.RUNNING:
        phase = desc.typed_search_attributes.get(sa.PHASE)
        return SubmissionRefused(
            "workflow_id",
            f"{workflow_id!r} is a running job{f' ({phase})' if phase else ''}; "
            "choose another id, or cancel it first",
        )
    if rerun:
        return None
    ended = desc.typed_search_attributes.get(sa.PHASE) or (
        desc.status.name if desc.status else "ENDED"
    )
    return SubmissionRefused(
        "workflow_id",
        f"{workflow_id!r} already ran (it ended {ended}); choose another id, or ask for a new "
        "run under the same id explicitly (--rerun; rerun=True in Python)",
    )


def reuse_policy(rerun: bool) -> WorkflowIDReusePolicy:
    """A used id is refused unless a re-run is asked for (never while a run is live)."""
    return (
        WorkflowIDReusePolicy.ALLOW_DUPLICATE if rerun else WorkflowIDReusePolicy.REJECT_DUPLICATE
    )


# -------------------------------------------------------------------------- backends


#: What a worker advertises, each as `` <kind>=name,name`` after its pid@host: the backend
#: profiles it reaches, the training loops registered with it (and, room for them, the
#: programs). Names never hold spaces or commas (spec.BACKEND_NAME, spec.LOOP_NAME).
ADVERTISED = ("backends", "loops", "programs", "caps", "pools")
#: Temporal refuses identities longer than its id limit (1000 by default): a list that
#: would not fit is advertised as "*" (not listed: nothing can be said about it).
MAX_IDENTITY = 900


def worker_identity(
    backends: Iterable[str],
    *,
    loops: Iterable[str] | None = None,
    programs: Iterable[str] | None = None,
    capabilities: Iterable[str] | None = None,
    pools: Iterable[str] | None = None,
) -> str:
    """A worker's Temporal identity, advertising the backend profiles it can reach and
    the loops (programs) registered with it; a submission reads them back from the task
    queue's pollers (:func:`advertised`)."""
    identity = f"{os.getpid()}@{socket.gethostname()}{_BACKENDS}{','.join(sorted(backends))}"
    kinds = (("loops", loops), ("programs", programs), ("caps", capabilities), ("pools", pools))
    for kind, names in kinds:
        if names is None:
            continue
        listed = f" {kind}={','.join(sorted(names))}"
        identity += listed if len(identity) + len(listed) <= MAX_IDENTITY else f" {kind}=*"
    return identity


def parse_identity(identity: str) -> dict[str, set[str] | None]:
    """What one worker identity advertises, by kind (None: "*", not listed)."""
    out: dict[str, set[str] | None] = {}
    for token in identity.split(" ")[1:]:
        kind, sep, names = token.partition("=")
        if sep and kind in ADVERTISED:
            out[kind] = None if names == "*" else {n for n in names.split(",") if n}
    return out


async def until_polled(client: Client, task_queue: str, timeout: timedelta = LISTED_WITHIN) -> bool:
    """Until the server lists a poller of ``task_queue`` for workflows and for activities
    (False: not within ``timeout``)."""
    kinds = (TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout.total_seconds()
    for kind in kinds:
        while not await pollers(client, task_queue, kind):
            if loop.time() >= deadline:
                return False
            await asyncio.sleep(0.05)
    return True


async def pollers(client: Client, task_queue: str, kind: TaskQueueType.ValueType) -> list[Any]:
    """The workers polling ``task_queue`` (for workflow or activity tasks) lately; an
    empty list also when the server does not let us ask (not a reason to refuse)."""
    try:
        answer = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=task_queue),
                task_queue_type=kind,
            )
        )
    except RPCError as exc:
        if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
            raise
        return []
    return list(answer.pollers)


async def advertised(client: Client, task_queue: str, kind: str) -> set[str] | None:
    """The names of ``kind`` (backends, loops, programs) the workers polling
    ``task_queue`` for activities advertise; None when no poller lists them (workers too
    old, or a list too long to advertise: nothing can be said)."""
    lists = [
        parse_identity(p.identity).get(kind, None)
        for p in await pollers(client, task_queue, TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY)
    ]
    if not lists or any(names is None for names in lists):
        return None
    return {name for names in lists if names for name in names}


async def served_backends(client: Client, task_queue: str) -> set[str] | None:
    """The backends the workers polling ``task_queue`` for activities advertise; None when
    no poller advertises any (nothing can be said)."""
    return await advertised(client, task_queue, "backends")


async def check_backend(client: Client, task_queue: str, backend: str, field: str) -> None:
    served = await served_backends(client, task_queue)
    if served is not None and backend not in served:
        raise SubmissionRefused(
            field,
            f"no worker on task queue {task_queue!r} serves backend {backend!r} "
            f"(they serve: {', '.join(sorted(served)) or 'none'}); see SHEPHERD_BACKENDS",
        )


async def check_capabilities(
    client: Client, task_queue: str, backend: str, required: Iterable[str], field: str
) -> None:
    """Refuse a job needing capabilities no worker's profile of its backend declares (the
    workers advertise ``<backend>/<tag>``; where none advertises any, the job's preflight
    checks on the worker)."""
    wanted = set(required)
    if not wanted:
        return
    declared = await advertised(client, task_queue, "caps")
    if declared is None:
        return
    offered = {c.partition("/")[2] for c in declared if c.partition("/")[0] == backend}
    if missing := sorted(wanted - offered):
        raise SubmissionRefused(
            field,
            f"backend {backend!r} declares no capability {', '.join(missing)} on any worker "
            f"of task queue {task_queue!r} (it declares: {', '.join(sorted(offered)) or 'none'}; "
            "see SHEPHERD_BACKEND_<NAME>_CAPABILITIES)",
        )


async def check_pool(
    client: Client, task_queue: str, backend: str, pool: str | None, field: str
) -> None:
    """Refuse a job whose kind of trainer (its pool: training shape or accelerator type) has
    no slots where its backend's profile divides its slots into pools (the workers advertise
    ``<backend>/<pool>``; a backend that declares none takes every job)."""
    declared = await advertised(client, task_queue, "pools")
    if declared is None:
        return
    pools = {p.partition("/")[2] for p in declared if p.partition("/")[0] == backend}
    if pools and pool not in pools:
        named = f"names {pool!r}" if pool else "names neither"
        raise SubmissionRefused(
            field,
            f"backend {backend!r} has slots for {', '.join(sorted(pools))} only (its pools, "
            f"SHEPHERD_BACKEND_<NAME>_POOLS); the job {named}: set trainer.accelerator_type "
            "or trainer.training_shape to one of them",
        )


#: How a worker gets a loop or a program registered (shepherd/loops.py, shepherd/programs.py).
REGISTER_HOW = {
    "loops": "SHEPHERD_LOOPS=name=module:attr",
    "programs": 'SHEPHERD_PROGRAMS=\'{"name": {"module": "pkg.module"}}\'',
}


async def check_registered(
    client: Client, task_queue: str, kind: str, name: str, field: str
) -> None:
    """Refuse a loop (or program) no worker on ``task_queue`` has registered."""
    served = await advertised(client, task_queue, kind)
    if served is not None and name not in served:
        noun = kind.removesuffix("s")
        raise SubmissionRefused(
            field,
            f"no worker on task queue {task_queue!r} has a {noun} {name!r} registered "
            f"(they have: {', '.join(sorted(served)) or 'none'}); register it with the "
            f"workers ({REGISTER_HOW[kind]}, or the 'shepherd.{kind}' entry-point group)",
        )


async def check_polled(client: Client, task_queue: str, field: str, *, activities: bool) -> None:
    """Refuse a task queue no worker polls: a job there would wait for ever (its status
    query too). ``activities``: the queue of the job's activities, else of its workflow."""
    kind = (
        TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY
        if activities
        else TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW
    )
    loop = asyncio.get_running_loop()
    deadline = loop.time() + POLLER_GRACE.total_seconds()
    while not await pollers(client, task_queue, kind):
        if loop.time() < deadline:
            await asyncio.sleep(0.25)
            continue
        raise SubmissionRefused(
            field,
            f"no worker polls task queue {task_queue!r} (start one: shepherd worker "
            f"--task-queue {task_queue}; or choose a queue workers poll)",
        )


# ------------------------------------------------------------------------ model claims


def claim_query(model_id: str) -> str:
    return f'{sa.OUTPUT_MODEL.name} = {_quote(model_id)} AND ExecutionStatus = "Running"'


async def claim_holder(
    client: Client, model_id: str, *, exclude: str | None = None
) -> tuple[str, str | None] | None:
    """The live job or sweep claiming ``model_id`` (workflow id, phase), if any, other than
    the workflow ``exclude`` (a scheduled run checking for others)."""
    try:
        async for ex in client.list_workflows(claim_query(model_id), limit=10):
            if ex.id == exclude:
                continue
            # Visibility may lag: a run that has just closed can still be listed, or the
            # next run after a continue-as-new not yet. The workflow's current run is what
            # counts.
            desc = await client.get_workflow_handle(ex.id).describe()
            attrs = desc.typed_search_attributes
            if (
                desc.status == WorkflowExecutionStatus.RUNNING
                and attrs.get(sa.OUTPUT_MODEL) == model_id
            ):
                return ex.id, attrs.get(sa.PHASE)
    except RPCError as exc:
        if exc.status == RPCStatusCode.INVALID_ARGUMENT:
            raise ValueError(
                f"the model-id claim could not be checked ({exc.message}); Shepherd's search "
                "attributes are missing in this namespace: start a worker once (it registers "
                "them) or see docs/production.md"
            ) from None
        raise
    return None


async def check_unclaimed(
    client: Client, model_id: str, field: str, *, exclude: str | None = None
) -> None:
    holder = await claim_holder(client, model_id, exclude=exclude)
    if holder is not None:
        workflow_id, phase = holder
        raise SubmissionRefused(
            field,
            f"{model_id!r} is claimed by {workflow_id}{f' ({phase})' if phase else ''}, which "
            "is still live; choose another model id, or wait until it ends",
        )


async def take_lock(client: Client, model_id: str) -> WorkflowHandle[Any, Any]:
    """The claim lock of ``model_id``, waiting up to LOCK_WAIT while another holds it."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + LOCK_WAIT.total_seconds()
    while True:
        try:
            return await client.start_workflow(
                CLAIM_LOCK_TYPE,
                id=lock_id(model_id),
                task_queue=CLAIM_QUEUE,
                execution_timeout=LOCK_TIMEOUT,
                id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                static_summary=f"lock: a submission is claiming output model {model_id!r} "
                "(never runs; released within seconds)",
            )
        except WorkflowAlreadyStartedError:
            if loop.time() > deadline:
                raise SubmissionRefused(
                    "model_id",
                    f"another submission has been claiming {model_id!r} for "
                    f"{LOCK_WAIT.total_seconds():.0f}s; try again",
                ) from None
            await asyncio.sleep(0.1)


async def release_lock(client: Client, model_id: str, run_id: str | None) -> None:
    """End the lock run ``run_id`` (only that one: once it has timed out, the lock may be
    another claimant's)."""
    with contextlib.suppress(RPCError):
        await client.get_workflow_handle(lock_id(model_id), run_id=run_id).terminate(
            "claim settled"
        )


def lock_id(model_id: str) -> str:
    return f"shepherd-claim-{model_id}"


async def until_visible(client: Client, model_id: str, workflow_id: str) -> None:
    """Wait (at most VISIBLE_WAIT) until ``workflow_id``'s claim of ``model_id`` shows in
    visibility, so whoever takes the lock next sees it."""
    # Not filtered on status: a run that has ended already by now needs no claim either.
    query = f"WorkflowId = {_quote(workflow_id)} AND {sa.OUTPUT_MODEL.name} = {_quote(model_id)}"
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(VISIBLE_WAIT.total_seconds()):
            while True:  # polling visibility: it has no notification to wait on
                if (await client.count_workflows(query)).count:
                    return
                await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def claimed(client: Client, model_id: str | None, field: str) -> AsyncIterator[list[str]]:
    """Check ``model_id`` is unclaimed and hold the claim lock while the caller starts its
    workflow; the caller appends the started workflow id to the yielded list. No model id:
    nothing to claim, nothing locked."""
    started: list[str] = []
    if model_id is None:
        yield started
        return
    lock = await take_lock(client, model_id)
    try:
        await check_unclaimed(client, model_id, field)
        yield started
        for workflow_id in started:
            await until_visible(client, model_id, workflow_id)
    finally:
        await release_lock(client, model_id, lock.result_run_id)


async def start_guarded(
    client: Client,
    workflow: str,
    arg: Any,
    *,
    workflow_id: str,
    task_queue: str,
    rerun: bool,
    model_id: str | None,
    model_field: str,
    **options: Any,
) -> WorkflowHandle[Any, Any]:
    """Start ``workflow`` under ``workflow_id`` (refused if that id is live, or used and no
    re-run was asked for) claiming ``model_id``."""
    async with claimed(client, model_id, model_field) as started:
        try:
            handle = await client.start_workflow(
                workflow,
                arg,
                id=workflow_id,
                task_queue=task_queue,
                id_reuse_policy=reuse_policy(rerun),
                id_conflict_policy=WorkflowIDConflictPolicy.FAIL,
                **options,
            )
        except WorkflowAlreadyStartedError:
            refusal = await id_refusal(client, workflow_id, rerun=rerun)
            raise refusal or SubmissionRefused(
                "workflow_id", f"{workflow_id!r} is taken; choose another id"
            ) from None
        started.append(handle.id)
    return handle
