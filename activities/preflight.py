"""The job's first activity: everything about a spec that only a worker can check, before
any trainer exists (issue 17, "fail before the GPU").

The submitting client validates the spec and asks the task queue's pollers what they
serve, but it holds no platform key and sees no worker's disk. This activity, on a worker
of the job's queue, checks the rest: the loop is registered here and reports the tracked
metric, the dataset is readable here and parses, the base model exists on the backend for
this account; a program job's program is registered here, its arguments leave alone what
its registration fixes, and the tokenizer its model argument names loads on an offline worker.
Every problem is reported at once, each as ``field: rule``; the job then fails before it is
provisioned. A job whose checks all pass may have its first ask for a slot sent from here
(``PreflightInput.ask``): one activity less in every job's intake.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable

from temporalio import activity

from activities.base import ClientProvider, log, refusal, translate
from shepherd import datasets, loops, offline, programs
from shepherd.models import PreflightInput, PreflightResult
from shepherd.platform import NotFound, PermissionDenied, PlatformError, rules
from shepherd.scheduling import Ask
from workflows import policies

#: Sends a job's ask to its backend's scheduler (``SchedulingActivities.ask``).
Asker = Callable[[str, Ask], Awaitable[None]]


class PreflightActivities:
    def __init__(self, clients: ClientProvider, ask: Asker | None = None) -> None:
        self.clients = clients
        self._ask = ask

    @activity.defn(name="preflight")
    async def preflight(self, inp: PreflightInput) -> PreflightResult:
        problems: list[tuple[str, str]] = []  # (error type, "field: rule")
        if inp.loop is not None:
            problems += _loop_problems(inp)
        if inp.program is not None:
            problems += await _program_problems(inp)
        if inp.dataset is not None and (
            problem := datasets.check_readable(inp.dataset, inp.validation_split)
        ):
            problems.append((policies.INVALID_DATASET, f"training.dataset: {problem}"))
        if problem := await self._base_model_problem(inp):
            problems.append((policies.INVALID_BASE_MODEL, f"trainer.base_model: {problem}"))
        for field, deployment in inp.deployments.items():
            try:
                await self.clients.client(inp.backend).get_deployment(deployment)
            except NotFound:
                problems.append(
                    (
                        policies.INVALID_REQUEST,
                        f"{field}: deployment {deployment} does not exist on backend "
                        f"{inp.backend!r}",
                    )
                )
            except PlatformError as exc:
                raise translate(exc, f"looking deployment {deployment} up") from None
        if problems:
            log().info("job.preflight_refused", problems=[p for _, p in problems])
            raise refusal("; ".join(p for _, p in problems), problems[0][0])
        profile = getattr(self.clients, "profiles", {}).get(inp.backend)
        admission = getattr(profile, "slots", None) is not None
        return PreflightResult(
            total_steps=_program_total(inp),
            admission=admission,
            asked=admission and await self._asked(inp),
        )

    async def _asked(self, inp: PreflightInput) -> bool:
        """The job's first ask, sent for it now that every check passed: whether it was.
        A failure is no refusal (the job asks again itself, with its own retries)."""
        if inp.ask is None or self._ask is None:
            return False
        try:
            await self._ask(inp.backend, inp.ask)
        except Exception as exc:  # noqa: BLE001 - said, and the job's own ask follows
            log().warning("job.preflight_ask_failed", error=f"{type(exc).__name__}: {exc}")
            return False
        return True

    async def _base_model_problem(self, inp: PreflightInput) -> str | None:
        m = rules.MODEL_NAME_RE.match(inp.base_model)
        if m is None:
            return None  # not a resource name (the spec refuses those); nothing to ask
        client = self.clients.client(inp.backend)
        try:
            await client.get_model(inp.base_model)
        except NotFound:
            return f"{inp.base_model} does not exist on backend {inp.backend!r}"
        except PermissionDenied:
            return (
                f"{inp.base_model} belongs to account {m['account']}, whose models backend "
                f"{inp.backend!r}'s account may not train on"
            )
        except PlatformError as exc:
            raise translate(exc, "looking the base model up") from None
        return None


def _loop_problems(inp: PreflightInput) -> list[tuple[str, str]]:
    assert inp.loop is not None
    try:
        loop = loops.resolve(inp.loop)
    except loops.LoopLoadError as exc:
        return [(policies.LOOP_ERROR, str(exc))]
    reports = loops.declared_metrics(loop)
    if inp.metric is not None and reports is not None and inp.metric not in reports:
        return [
            (
                policies.METRIC_MISSING,
                f"checkpoint.metric: loop {inp.loop!r} reports {', '.join(reports)}, "
                f"not {inp.metric!r}",
            )
        ]
    return []


def _program_total(inp: PreflightInput) -> int | None:
    """A program's total, from its arguments: what ``status`` and ``watch`` show from the
    job's start (not ``step 0/0`` until the program runs)."""
    if inp.program is None:
        return None
    try:
        return programs.resolve(inp.program).total_steps(inp.args)
    except programs.ProgramError:
        return None


async def _program_problems(inp: PreflightInput) -> list[tuple[str, str]]:
    assert inp.program is not None
    try:
        program = programs.resolve(inp.program)
    except programs.ProgramError as exc:
        return [(programs.INVALID_PROGRAM, str(exc))]
    problems = [
        (programs.INVALID_PROGRAM, f"{field}: {rule}")
        for field, rule in program.arg_problems(inp.args)
    ]
    if problem := program.problem():
        problems.append((programs.INVALID_PROGRAM, f"training.program: {problem}"))
    model = program.model_name(inp.args)
    # The environment the program gets (a registration's env may name another cache); in a
    # thread: loading a real tokenizer takes a moment (once per model and cache).
    env = {**os.environ, **program.env}
    if (
        model is not None
        and not problems
        and (problem := await asyncio.to_thread(offline.tokenizer_problem, model, env))
    ):
        problems.append(
            (programs.TOKENIZER_MISSING, f"training.args.{program.model_arg}: {problem}")
        )
    return problems
