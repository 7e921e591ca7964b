"""Unmodified Tinker programs under Shepherd (issue 18): a program job runs the program behind
its data-plane proxy while the lifecycle owns the trainer. Trainers here speak only the JSON
dialect (as hosted ones do), so what the programs' SDKs send is really translated.

The programs: the plain ``tinker`` script of examples/programs/tinker_sft.py, and the
tinker-cookbook's ``chat_sl`` and ``math_rl`` recipes, unmodified (offline, with the byte-level
tokenizer of tests/plane/cookbook_support.py)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import tinker_cookbook
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import CancelledError

from localplane.admin import PlaneAdmin
from shepherd.client import JobSummary
from shepherd.models import JobStatus, PauseRequest, PauseResult, ResumeRequest
from shepherd.phases import Phase
from shepherd.platform import NotFound
from shepherd.states import JobState
from tests.helpers import gateway_api, job_request, run_cli, wait_state, warm
from tests.plane import cookbook_support as cb
from tests.proxy.rig import finish, program_env, start_program, stop
from tests.workflows.conftest import Stack

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "examples" / "programs" / "tinker_sft.py"
BASE = "accounts/fireworks/models/qwen3-8b"


def sft_spec(
    stack: Stack,
    name: str,
    steps: int = 12,
    args: dict[str, Any] | None = None,
    program: str = "tinker-sft",
    **sections: Any,
) -> Any:
    return stack.spec(
        name,
        trainer={"base_model": BASE, "lora_rank": 4, "extra_args": ["--compute-delay-ms=40"]},
        training={
            "total_steps": None,
            "program": program,
            "args": {"steps": steps, **(args or {})} if program != "idle" else (args or {}),
        },
        **{"checkpoint": {"every_steps": 4, "keep_last": 2}, **sections},
    )


def printed(directory: Path, handle: WorkflowHandle[Any, Any]) -> list[dict[str, Any]]:
    """What the program printed on stdout (its JSON lines), from its log directory."""
    lines = (directory / handle.id / "program.log").read_text().splitlines()
    out = []
    for raw in lines:
        entry = json.loads(raw)
        if entry["stream"] == "stdout" and entry["line"].startswith("{"):
            out.append(json.loads(entry["line"]))
    return out


async def program_starts(handle: WorkflowHandle[Any, Any]) -> int:
    """How many times the program was started (its ``program_started`` signals)."""
    count = 0
    async for event in handle.fetch_history_events():
        signaled = event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED
        name = event.workflow_execution_signaled_event_attributes.signal_name
        count += signaled and name == "program_started"
    return count


async def test_a_plain_tinker_script_runs_unchanged_as_a_job(
    stack: Stack, programs_env: Path, faults: PlaneAdmin
) -> None:
    handle = await stack.start(sft_spec(stack, "script"))
    final: JobStatus = await handle.result()
    assert final.phase is Phase.COMPLETED and final.step == 12 and final.total_steps == 12
    # Shepherd's checkpoints every 4 optimizer steps (and the final one), the last promoted.
    names = [c.name.rsplit("/", 1)[-1] for c in final.checkpoints]
    assert names[-1] == "step-00000012" and final.model is not None
    assert final.last_loss is not None and len(final.loss_curve) >= 2
    out = printed(programs_env, handle)
    steps = [line for line in out if "loss" in line]
    assert [s["step"] for s in steps] == list(range(1, 13))
    assert abs(steps[-1]["loss"] - final.last_loss) < 1e-6 * max(1.0, abs(final.last_loss))
    assert await program_starts(handle) == 1
    stats = await stack.admin.stats()
    trainer = stats["jobs"][stack.job_name(final.trainer_job_id or "")]
    assert trainer["creates"] == 1 and not trainer["liveTrainer"]
    assert set(k.split(":")[0] for k in trainer["dataPlane"]) == {"json"}  # translated
    # The job list (search attributes, no worker needed) shows the program's step too.
    assert JobSummary.from_execution(await handle.describe()).step == 12
    # The program's output is in the job's story.
    logs = await run_cli("logs", handle.id, stack=stack)
    assert logs.returncode == 0, logs.stderr
    assert '[program] {"step": 12' in logs.stdout

    # The same script straight against a trainer (speaking both dialects), as it runs
    # without Shepherd: the same per-step losses and weights.
    await faults.set_faults(trainerProtobuf=True)
    client, job_id = stack.account.client, f"direct-{uuid.uuid4().hex[:8]}"
    config = {"lora_rank": 4, "extra_args": ["--compute-delay-ms=40"]}
    await client.create_job(job_id, job_request(training_config=config))
    proc = None
    try:
        await wait_state(client, job_id, JobState.RUNNING)
        api = gateway_api(stack.account, job_id)
        try:
            await warm(api, probes=6)
        finally:
            await api.http.aclose()
        env = program_env(api.base_url, stack.account.api_key)
        proc = await start_program([str(SCRIPT), "steps=12"], env)
        direct = await finish(proc)
    finally:
        if proc is not None:
            await stop(proc)
        await client.delete_job(job_id)
    assert per_step(direct.lines) == per_step(out)


@pytest.mark.parametrize(
    ("program", "steps"),
    [("tinker-sft", 8), ("tinker-sft", 10), ("fork-loop", 4), ("fork-loop", 7)],
    ids=["tinker-multiple", "tinker-not-multiple", "fork-multiple", "fork-not-multiple"],
)
async def test_the_promoted_model_is_the_weights_the_program_ended_with(
    stack: Stack, programs_env: Path, program: str, steps: int
) -> None:
    """Whatever the step total (a multiple of the checkpoint interval or not) and whichever
    SDK (each finishes its session on the way out): the job completes, its program started
    once, its last checkpoint is the program's last step, and the promoted model's weights
    are the ones the program ended with — by digest. ``keep_last`` holds on the plane."""
    name = f"last-{program}-{steps}"
    spec = sft_spec(stack, name, steps=steps, program=program)
    handle = await stack.start(spec)
    async with asyncio.timeout(240):
        final: JobStatus = await handle.result()
    assert final.phase is Phase.COMPLETED and final.step == steps
    assert await program_starts(handle) == 1
    assert final.checkpoints[-1].step == steps
    out = printed(programs_env, handle)
    ended = [line for line in out if "final" in line]
    assert len(ended) == 1 and ended[0]["digest"]
    assert await promoted_digest(stack, name) == ended[0]["digest"]
    # The tracked metric's curve: a program's training loss at each checkpoint.
    assert [p.step for p in final.eval_curve][-1] == steps
    # checkpoint.keep_last (2): the last two, and the best, are all that is kept.
    listed = await stack.account.client.list_checkpoints(final.trainer_job_id or "")
    kept = {c.name.rsplit("/", 1)[-1].removesuffix("-sampler") for c in listed.checkpoints}
    kept = {n for n in kept if n.startswith("step-")}
    assert kept == {c.name.rsplit("/", 1)[-1] for c in final.checkpoints}
    assert 1 <= len(kept) <= 3, kept


async def test_a_program_that_trains_nothing_fails_promotion_at_once(
    stack: Stack, programs_env: Path
) -> None:
    """``promote: last`` and no checkpoint: the job fails saying why (it must not hang in
    EVALUATING on a failed workflow task), and its trainer is deleted."""
    spec = sft_spec(stack, "idle", program="idle", output={"promote": "last"})
    handle = await stack.start(spec)
    with pytest.raises(WorkflowFailureError):
        async with asyncio.timeout(120):
            await handle.result()
    status = await stack.status(handle)
    assert status.phase is Phase.FAILED and status.error is not None
    assert status.error.type == "NoCheckpoint" and "output.promote" in status.error.message
    assert status.cleanup == "done"


async def test_a_program_that_holds_its_trainer_idle_is_told_in_its_log(
    stack: Stack, programs_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A RUNNING trainer the program sends nothing to is said to be idle, in the job's story
    (``shepherd logs``), once per interval (here 1 s instead of 10 min)."""
    from workflows import policies

    monkeypatch.setattr(policies, "PROGRAM_IDLE_WARNING", timedelta(seconds=1))
    spec = sft_spec(
        stack, "daydream", program="idle", args={"sleep": 6}, output={"promote": "none"}
    )
    handle = await stack.start(spec)
    final: JobStatus = await handle.result()
    assert final.phase is Phase.COMPLETED
    logs = await run_cli("logs", handle.id, stack=stack)
    assert logs.returncode == 0, logs.stderr
    said = [line for line in logs.stdout.splitlines() if "has sent its trainer" in line]
    assert said and all("[shepherd]" in line for line in said), logs.stdout
    assert len(said) <= 6


async def test_a_preemption_while_the_proxy_restores_is_recovered_too(
    stack: Stack, programs_env: Path, faults: PlaneAdmin
) -> None:
    """The trainer is lost again while the proxy restores the program's model on the one the
    first recovery brought back (its load held, then the trainer preempted): a second
    recovery, not a failed job; the program ends with its own weights, started once."""
    data = r"/training/v1/rlorTrainerJobs/[^/]+/[^/]+/api/v1/"
    handle = await stack.start(sft_spec(stack, "twice", steps=12))
    await until_printed(programs_env, handle, 6)  # past the checkpoint at step 4
    trainer = (await stack.status(handle)).trainer_job_id or ""
    hold = await faults.hold(data + "load_weights$", method="POST")
    await faults.preempt(trainer)
    async with asyncio.timeout(60):
        while not await faults.held(hold):
            await asyncio.sleep(0.05)
    await faults.preempt(trainer)  # the restore's load is in flight on it
    await faults.release(hold)
    final: JobStatus = await handle.result()
    assert final.phase is Phase.COMPLETED and final.step == 12
    assert len(final.recoveries) == 2 and final.preemptions == 2
    assert await program_starts(handle) == 1
    out = printed(programs_env, handle)
    assert [line["step"] for line in out if "loss" in line] == list(range(1, 13))
    ended = [line for line in out if "final" in line]
    assert await promoted_digest(stack, "twice") == ended[-1]["digest"]


async def until_printed(directory: Path, handle: WorkflowHandle[Any, Any], step: int) -> None:
    """Wait until the program printed step ``step`` (a test-side wait)."""
    await until_printed_where(directory, handle, lambda line: line.get("step", 0) >= step)


async def until_printed_where(
    directory: Path, handle: WorkflowHandle[Any, Any], check: Callable[[dict[str, Any]], bool]
) -> None:
    """Wait until the program printed a line ``check`` accepts (a test-side wait)."""
    async with asyncio.timeout(60):
        while True:
            with contextlib.suppress(OSError, ValueError):
                if any(check(line) for line in printed(directory, handle)):
                    return
            await asyncio.sleep(0.1)


async def optim_steps_served(stack: Stack) -> int:
    """optim_step requests the account's trainers served, every job together."""
    total = 0
    for job in (await stack.account.client.list_jobs()).rlor_trainer_jobs:
        served = await stack.admin.data_plane(stack.job_name(job.job_id))
        total += sum(n for key, n in served.items() if key.endswith(":optim_step"))
    return total


def per_step(out: list[dict[str, Any]]) -> list[tuple[int, float, str]]:
    return [(line["step"], line["loss"], line["digest"]) for line in out if "loss" in line]


async def test_a_script_survives_two_preemptions_and_a_route_race_unaware(
    stack: Stack, programs_env: Path, faults: PlaneAdmin
) -> None:
    clean = await stack.start(sft_spec(stack, "clean", steps=16))
    await clean.result()
    served_clean = await optim_steps_served(stack)
    hurt = await stack.start(sft_spec(stack, "hurt", steps=16))
    await until_printed(programs_env, hurt, 5)
    trainer = (await stack.status(hurt)).trainer_job_id or ""
    await faults.preempt(trainer)
    await until_printed(programs_env, hurt, 10)
    # The resumed trainer's route reaches the gateway's replicas late: the route race.
    await faults.set_faults(routeLagSeconds={"min": 1.0, "max": 2.0})
    await faults.preempt(trainer)
    final: JobStatus = await hurt.result()

    assert final.phase is Phase.COMPLETED and final.step == 16
    assert [r.reason for r in final.recoveries] == ["preemption", "preemption"]
    # After each recovery the restored model's weights are the lost trainer's at that step.
    assert all(r.weights_verified for r in final.recoveries), final.recoveries
    assert await program_starts(hurt) == 1  # never restarted
    # The program saw every step once, with the losses and weights of the clean run.
    assert per_step(printed(programs_env, hurt)) == per_step(printed(programs_env, clean))
    redone = sum(r.steps_redone or 0 for r in final.recoveries)
    assert await optim_steps_served(stack) - served_clean == 16 + redone
    assert redone <= 2 * 4  # at most a checkpoint interval per preemption
    stats = await stack.admin.job_stats(stack.job_name(trainer))
    assert stats["creates"] == 1 and stats.get("route404s", 0) > 0


# ---------------------------------------------------------------- the cookbook, unmodified

CONVERSATIONS = Path(tinker_cookbook.__file__).parent / "example_data" / "conversations.jsonl"
#: chat_sl on the cookbook's own 128 conversations, in batches of 16: 8 optimizer steps.
CHAT_SL: dict[str, Any] = {
    "dataset": str(CONVERSATIONS),
    "model_name": cb.MODEL,
    "renderer_name": cb.RENDERER,
    "lora_rank": 4,
    "batch_size": 16,
    "max_length": 256,
    "learning_rate": 0.01,
    "save_every": 3,
    "eval_every": 0,
    "infrequent_eval_every": 0,
}
#: math_rl's arithmetic environment (no data): 6 steps of 4 groups of 4 samples.
MATH_RL: dict[str, Any] = {
    "env": "arithmetic",
    "model_name": cb.MODEL,
    "renderer_name": cb.RENDERER,
    "loss_fn": "importance_sampling",
    "lora_rank": 4,
    "group_size": 4,
    "groups_per_batch": 4,
    "max_tokens": 4,
    "learning_rate": 0.01,
    "max_steps": 6,
    "save_every": 3,
}


def recipe_spec(stack: Stack, name: str, program: str, args: dict[str, Any]) -> Any:
    return stack.spec(
        name,
        # Slow enough steps (emulated GPU time) that a test acts mid-run.
        trainer={"base_model": BASE, "lora_rank": 4, "extra_args": ["--compute-delay-ms=250"]},
        training={"total_steps": None, "program": program, "args": args},
        checkpoint={"every_steps": 2, "keep_last": 2},
    )


async def until_step(log_dir: Path, step: int, timeout: float = 120) -> None:
    """Wait until the recipe logged its step ``step`` (its metrics.jsonl counts from 0)."""
    async with asyncio.timeout(timeout):
        while True:
            with contextlib.suppress(OSError, ValueError):
                if any(m["step"] >= step - 1 for m in cb.metrics(log_dir)):
                    return
            await asyncio.sleep(0.05)


async def promoted_digest(stack: Stack, name: str) -> str:
    model = await stack.account.client.get_model(f"{name}-model")
    return str((model.model_extra or {})["weightsDigest"])


async def until_step_or_end(
    stack: Stack, handle: WorkflowHandle[Any, Any], log_dir: Path, step: int
) -> None:
    """Wait until the recipe logged its step ``step``; fail at once if the job ends first."""
    reached = asyncio.ensure_future(until_step(log_dir, step))
    ended = asyncio.ensure_future(handle.result())
    await asyncio.wait({reached, ended}, return_when=asyncio.FIRST_COMPLETED)
    for task in (reached, ended):
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    if not reached.done() or reached.cancelled() or reached.exception() is not None:
        status = await stack.status(handle)
        raise AssertionError(
            f"the job ended ({status.phase}) before its program's step {step}: {status.error}"
        )


def superseded(final: JobStatus) -> list[int]:
    """The recoveries (numbers) the next loss struck before the job went any further (no
    checkpoint in between): their restore may have been cut short."""
    after = [*final.recoveries[1:], None]
    return [
        r.number
        for r, nxt in zip(final.recoveries, after, strict=True)
        if nxt is not None
        and not any(
            c.saved_at and r.started_at < c.saved_at < nxt.started_at for c in final.checkpoints
        )
    ]


def cut_short(final: JobStatus) -> int:
    """How many recoveries' restores the next loss cut short (superseded, never verified):
    each may have redone steps on its trainer that no record counts."""
    cut = superseded(final)
    return sum(1 for r in final.recoveries if r.number in cut and r.weights_verified is None)


def check_verified(final: JobStatus) -> None:
    """After each recovery the restored model's weights are the lost trainer's: the proxy
    compares the trainer's weights digests (of the checkpoint it restored, and at the step it
    redid up to) with those the lost trainer reported. A recovery that had a Shepherd
    checkpoint to restore must say they matched. One that struck before the job's first
    checkpoint (restored from the model's creation) with its step in flight has nothing the
    lost trainer reported at the step the redo ends at: it may say None (not verified), never
    False. So may one whose restore the next loss struck before it ended (the next recovery
    restores and verifies instead): the job went no further in between — no checkpoint. And
    so may one that struck its trainer's first step after the previous restore, in flight:
    that trainer reported no digest to compare with."""
    cut = superseded(final)
    previous = [None, *final.recoveries[:-1]]
    for r, prev in zip(final.recoveries, previous, strict=True):
        before = [c.step for c in final.checkpoints if c.saved_at and c.saved_at < r.started_at]
        first_step_lost = prev is not None and r.at_step - prev.at_step <= 1
        if before and r.number not in cut and not first_step_lost:
            assert r.weights_verified is True, (r, before)
        else:
            assert r.weights_verified is not False, r


async def preempted_twice_with_a_route_race(
    stack: Stack,
    faults: PlaneAdmin,
    handle: WorkflowHandle[Any, Any],
    log_dir: Path,
    first: int,
    second: int,
) -> JobStatus:
    """Preempt the job's trainer at step ``first``, make the gateway's routes lag and preempt
    it again at step ``second``; the job's final status. Fails at once when the job ends
    before a step it waits for instead of waiting out a timeout."""
    await until_step_or_end(stack, handle, log_dir, first)
    trainer = (await stack.status(handle)).trainer_job_id or ""
    await faults.preempt(trainer)
    await until_step_or_end(stack, handle, log_dir, second)
    # Only a running trainer can be preempted: the program may have logged that step before
    # the first preemption took its trainer (a step's answer was already on its way), so the
    # trainer may still be coming back. Once it runs, the preemption may strike while the
    # proxy restores the program's model on it, as a real one may.
    await wait_state(stack.account.client, trainer, JobState.RUNNING, timeout=120)
    await faults.set_faults(routeLagSeconds={"min": 1.0, "max": 2.0})
    await faults.preempt(trainer)
    with contextlib.suppress(Exception):  # a failed job: its status says why, below
        await handle.result()
    final = await stack.status(handle)
    assert final.phase is Phase.COMPLETED, (final.phase, final.error)
    stats = await stack.admin.job_stats(stack.job_name(trainer))
    assert stats["creates"] == 1 and stats.get("route404s", 0) > 0
    return final


@pytest.mark.slow
async def test_cookbook_chat_sl_unmodified_survives_two_preemptions(
    stack: Stack, programs_env: Path, faults: PlaneAdmin
) -> None:
    # The run without faults goes beside the one with them (its trainer is never touched).
    clean = await stack.start(recipe_spec(stack, "sl-clean", "cookbook-chat-sl", CHAT_SL))
    hurt = await stack.start(recipe_spec(stack, "sl-hurt", "cookbook-chat-sl", CHAT_SL))
    final = await preempted_twice_with_a_route_race(
        stack, faults, hurt, programs_env / hurt.id, 2, 5
    )
    assert (await clean.result()).phase is Phase.COMPLETED

    assert final.phase is Phase.COMPLETED and final.step == 8
    assert len(final.recoveries) == 2
    check_verified(final)
    assert await program_starts(hurt) == 1
    redone = sum(r.steps_redone or 0 for r in final.recoveries)
    served = await stack.admin.data_plane(stack.job_name(final.trainer_job_id or ""))
    assert sum(n for key, n in served.items() if key.endswith(":optim_step")) == 8 + redone
    # The recipe ran to its end, as it does without Shepherd, and ended with the weights
    # of the run without faults.
    metrics = cb.metrics(programs_env / hurt.id)
    assert [m["step"] for m in metrics] == list(range(8))
    assert await promoted_digest(stack, "sl-hurt") == await promoted_digest(stack, "sl-clean")


@pytest.mark.slow
async def test_cookbook_math_rl_unmodified_survives_two_preemptions(
    stack: Stack, programs_env: Path, faults: PlaneAdmin
) -> None:
    handle = await stack.start(recipe_spec(stack, "rl", "cookbook-math-rl", MATH_RL))
    final = await preempted_twice_with_a_route_race(
        stack, faults, handle, programs_env / handle.id, 2, 4
    )
    assert final.phase is Phase.COMPLETED and final.step == 6 and final.total_steps == 6
    assert len(final.recoveries) == 2
    check_verified(final)
    assert await program_starts(handle) == 1
    redone = sum(r.steps_redone or 0 for r in final.recoveries)
    assert await optim_steps_served(stack) == 6 + redone
    metrics = cb.metrics(programs_env / handle.id)
    assert [m["step"] for m in metrics] == list(range(6))


# ------------------------------------------------------------- pause, cancel, a dead worker


def alive(pid: int) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status


async def program_pid(handle: WorkflowHandle[Any, Any]) -> int:
    """The running program's pid, from its activity's heartbeat."""
    async with asyncio.timeout(30):
        while True:
            desc = await handle.describe()
            for pending in desc.raw_description.pending_activities:
                payloads = pending.heartbeat_details.payloads
                if pending.activity_type.name == "run_program" and payloads:
                    beat = json.loads(payloads[0].data)
                    if isinstance(beat.get("program_pid"), int):
                        return int(beat["program_pid"])
            await asyncio.sleep(0.2)


async def test_a_paused_program_waits_holding_no_trainer_and_goes_on(
    stack: Stack, programs_env: Path
) -> None:
    clean = await stack.start(sft_spec(stack, "calm", steps=16))
    await clean.result()
    handle = await stack.start(sft_spec(stack, "napping", steps=16))
    await until_printed(programs_env, handle, 5)
    paused = await handle.execute_update(
        "request_pause", PauseRequest(reason="test"), result_type=PauseResult
    )
    status = await stack.status(handle)
    assert status.phase is Phase.PAUSED and paused.checkpoint is not None
    first = status.trainer_job_id or ""
    await wait_state(stack.account.client, first, JobState.DELETED)  # no GPU held
    # The program itself was not stopped: its requests wait for a trainer.
    assert alive(await program_pid(handle))
    await handle.execute_update("request_resume", ResumeRequest(), result_type=JobStatus)
    final: JobStatus = await handle.result()
    assert final.phase is Phase.COMPLETED and final.generation == 1
    assert per_step(printed(programs_env, handle)) == per_step(printed(programs_env, clean))
    assert await program_starts(handle) == 1


async def test_a_cancelled_program_is_stopped_and_its_trainer_deleted(
    stack: Stack, programs_env: Path
) -> None:
    handle = await stack.start(sft_spec(stack, "quitter", steps=200))
    await until_printed(programs_env, handle, 3)
    pid = await program_pid(handle)
    await handle.cancel()
    with pytest.raises(WorkflowFailureError) as failed:
        await handle.result()
    assert isinstance(failed.value.cause, CancelledError)
    status = await stack.status(handle)
    assert status.phase is Phase.CANCELLED and status.cleanup == "done"
    assert not alive(pid)  # stopped (SIGTERM, then SIGKILL) before the job ended
    await wait_state(stack.account.client, status.trainer_job_id or "", JobState.DELETED)
    with pytest.raises(NotFound):
        await stack.account.client.get_model("quitter-model")


@pytest.mark.slow
async def test_a_program_on_a_dead_worker_starts_again_and_resumes(
    stack: Stack, programs_env: Path, tmp_path: Path
) -> None:
    """The program dies with its worker; another worker starts it again in the same log
    directory and it resumes from its own checkpoint (the example script records the step
    its checkpoint holds, so its resume is exactly-once): the weights of a run without the
    crash, on the one trainer the job ever had."""
    from tests.workflows.test_worker_crash import worker_process

    clean = await stack.start(sft_spec(stack, "steady", steps=16))  # beside the crash
    queue = f"crash-{uuid.uuid4().hex[:8]}"
    spec = sft_spec(stack, "phoenix", steps=16, policies={"heartbeat_timeout": "3s"})
    with (
        worker_process(stack, queue, tmp_path, "w1") as w1,
        worker_process(stack, queue, tmp_path, "w2") as w2,
    ):
        handle = await stack.start(spec, task_queue=queue)
        await until_printed(programs_env, handle, 6)  # its own checkpoint holds step 4
        first_program = await program_pid(handle)
        running = await running_program_worker(handle)
        assert running in (w1.pid, w2.pid)
        victim = w1 if running == w1.pid else w2
        victim.send_signal(signal.SIGKILL)
        victim.wait(10)
        final: JobStatus = await handle.result()
    assert final.phase is Phase.COMPLETED and final.step == 16
    assert await program_starts(handle) == 2  # started again once, on the other worker
    assert not alive(first_program)  # it died with its worker
    stats = await stack.admin.job_stats(stack.job_name(final.trainer_job_id or ""))
    assert stats["creates"] == 1 and final.generation == 0  # the trainer was kept
    out = printed(programs_env, handle)
    resumed = [line for line in out if "resumed" in line]
    assert len(resumed) == 1 and resumed[0]["step"] in (4, 8), resumed
    assert (await clean.result()).phase is Phase.COMPLETED
    assert out[-1]["digest"] == printed(programs_env, clean)[-1]["digest"]


async def test_a_failed_program_fails_the_job_and_its_retry_resumes_from_its_checkpoints(
    programs_env: Path, stack: Stack
) -> None:
    # programs_env first: the stack's worker advertises the program a submission checks.
    """A program that exits non-zero fails the job with its stderr's tail (after its trainer
    is deleted). ``shepherd retry`` starts the program in a copy of the failed job's log
    directory: it resumes from its own last checkpoint, whose ``tinker://`` path (the failed
    job's proxy gave it) resolves on the new trainer, and ends with the weights of a run that
    never failed."""
    clean = await stack.start(sft_spec(stack, "straight"))  # beside the failing one
    failing = await stack.start(sft_spec(stack, "stumbles", args={"fail_after": 6}))
    with pytest.raises(WorkflowFailureError):
        await failing.result()
    failed = await stack.status(failing)
    assert failed.phase is Phase.FAILED and failed.error is not None
    assert "exited with status 1" in failed.error.message
    assert "fail_after=6: stopping after step 6" in failed.error.message  # its stderr
    assert failed.step == 6 and failed.cleanup == "done"

    wrong = await run_cli("retry", failing.id, "--from-checkpoint", "step-00000004", stack=stack)
    assert wrong.returncode == 2 and "from_checkpoint" in wrong.stderr, wrong.stderr
    retried = await run_cli(
        "retry", failing.id, "--set", "training.args.fail_after=0", "--json", stack=stack
    )
    assert retried.returncode == 0, retried.stderr
    child = stack.client.get_workflow_handle(
        json.loads(retried.stdout)["workflow_id"], result_type=JobStatus
    )
    stack.handles.append(child)
    final: JobStatus = await child.result()
    assert final.phase is Phase.COMPLETED and final.parent_workflow_id == failing.id
    out = printed(programs_env, child)
    resumed = [line for line in out if "resumed" in line]
    assert len(resumed) == 1 and resumed[0]["step"] == 4, resumed  # its own last save
    assert [line["step"] for line in out if "loss" in line] == list(range(5, 13))
    # The proxy counts on from the loaded state's step: the job's steps are the program's.
    assert final.step == 12 and final.checkpoints[-1].name.endswith("step-00000012")
    assert (await clean.result()).phase is Phase.COMPLETED
    assert out[-1]["digest"] == printed(programs_env, clean)[-1]["digest"]
    for status in (failed, final):
        stats = await stack.admin.job_stats(stack.job_name(status.trainer_job_id or ""))
        assert stats["creates"] == 1 and not stats["liveTrainer"]


async def running_program_worker(handle: WorkflowHandle[Any, Any]) -> int:
    """The pid of the worker running the job's program (its identity is pid@host ...)."""
    async with asyncio.timeout(30):
        while True:
            desc = await handle.describe()
            for pending in desc.raw_description.pending_activities:
                if pending.activity_type.name == "run_program" and pending.last_worker_identity:
                    return int(pending.last_worker_identity.split("@", 1)[0])
            await asyncio.sleep(0.2)
