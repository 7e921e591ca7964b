"""The proxy's pure pieces: the id map, the settings' names and route-race delays, the
bounded tables, and where the redo log is cut when a checkpoint becomes the restore point."""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import pytest
from pydantic import ValidationError

from shepherd.models import CheckpointRecord
from shepherd.proxy import ids
from shepherd.proxy.answers import settle
from shepherd.proxy.checkpoints import truncate
from shepherd.proxy.core import Core
from shepherd.proxy.ids import IdMap
from shepherd.proxy.redo import log_op, needs_redo
from shepherd.proxy.samplers import add as add_sampler
from shepherd.proxy.settings import (
    DEDUPE_WINDOW,
    MAX_KEPT_RESULTS,
    MIN_ROUTE_RACE_DELAY_S,
    RESULT_KEEP_AFTER_READ_S,
    ProxySettings,
)
from shepherd.proxy.state import Checkpoint, FutureTable, Model, Op, Sampler, Session
from shepherd.proxy.upstream import jsonable
from shepherd.tinker_wire.dialects import canonical_digest


def _settings(**overrides: Any) -> ProxySettings:
    return ProxySettings(**{"trainer_base_model": "m", "checkpoint_every": 4, **overrides})


# ------------------------------------------------------------------------------ ids


def test_trainer_ids_of_every_generation_read_as_the_programs() -> None:
    m = IdMap()
    m.learn_run("s1:train:0", "ps-a:train:0")
    m.learn_run("s2:train:3", "ps-a:train:0")  # the same program model, restored
    m.learn("req-9", "pr-1")
    assert m.program_str("s2:train:3") == "ps-a:train:0"
    assert (
        # Checkpoint paths stay the platform's: they outlive the job and resolve anywhere.
        m.program_str("tinker://s1:train:0/weights/final") == "tinker://s1:train:0/weights/final"
    )
    assert m.program_str("tinker://other:train:0/weights/x") == "tinker://other:train:0/weights/x"
    assert m.program_str("req-9:1") == "pr-1:1"  # a sampled sequence
    assert m.program_str("unrelated") == "unrelated"
    answer = {"model_id": "s2:train:3", "list": ["s1:train:0", 3], "n": None}
    assert m.program_value(answer) == {
        "model_id": "ps-a:train:0",
        "list": ["ps-a:train:0", 3],
        "n": None,
    }
    assert m.runs("ps-a:train:0") == ["s1:train:0", "s2:train:3"]


def test_a_programs_path_leads_to_the_file_its_save_made() -> None:
    m = IdMap()
    m.learn_run("s1:train:0", "ps-a:train:0")
    m.learn_path("tinker://ps-a:train:0/weights/a", "tinker://s1:train:0/weights/a")
    m.learn_run("s2:train:0", "ps-a:train:0")
    # Saved by the first generation: its file, whatever generation asks.
    assert m.trainer_path("tinker://ps-a:train:0/weights/a") == "tinker://s1:train:0/weights/a"
    # Never saved through the proxy: the model's latest run.
    assert m.trainer_path("tinker://ps-a:train:0/weights/b") == "tinker://s2:train:0/weights/b"
    # Not a program model's, or not a path: as given.
    assert m.trainer_path("tinker://x:train:0/weights/b") == "tinker://x:train:0/weights/b"
    assert m.trainer_path("step-5") == "step-5"


def test_the_id_map_is_bounded() -> None:
    m = IdMap(limit=3)
    for i in range(10):
        m.learn(f"t{i}", f"p{i}")
    assert m.program("t9") == "p9" and m.program("t0") is None


def test_shepherds_checkpoint_names_are_told_from_the_programs() -> None:
    mine = ids.shepherd_checkpoint("step-")
    assert all(
        mine.match(n) for n in ("step-00000004", "step-00000004-sampler", "step-00000004-m1")
    )
    assert not any(mine.match(n) for n in ("step-4", "000004", "final", "step-00000004x"))


# ------------------------------------------------------------------------- settings


def test_checkpoint_names_and_route_race_delays() -> None:
    s = _settings()
    assert s.checkpoint_name(40) == "step-00000040"
    assert s.checkpoint_name(40, 2) == "step-00000040-m3"
    delays = [s.race_delay(i) for i in range(1, s.route_race_retries + 1)]
    assert delays[0] == pytest.approx(MIN_ROUTE_RACE_DELAY_S)
    assert delays == sorted(delays)
    assert sum(delays) == pytest.approx(s.route_race_window_s)
    tight = _settings(route_race_retries=8, route_race_window_s=0.1)
    assert [tight.race_delay(i) for i in (1, 8)] == [MIN_ROUTE_RACE_DELAY_S] * 2


@pytest.mark.parametrize(
    "field, value",
    [
        ("checkpoint_prefix", "../x"),
        ("checkpoint_every", 0),
        ("lora_rank", -1),
        ("route_race_window_s", 1e9),
    ],
)
def test_settings_refuse_what_cannot_work(field: str, value: Any) -> None:
    with pytest.raises(ValidationError, match=field):
        _settings(**{field: value})


# --------------------------------------------------------------------------- tables


def test_results_are_dropped_by_age_and_count_never_unanswered() -> None:
    table = FutureTable()
    waiting = Op("forward", {})
    table.add(waiting)
    read = Op("forward", {})
    read.resolve({"x": 1})
    read.first_read = time.monotonic() - RESULT_KEEP_AFTER_READ_S - 1
    table.add(read)
    fresh = Op("forward", {})
    fresh.resolve({"x": 2})
    table.add(fresh)
    table.sweep(time.monotonic())
    assert table.get(waiting.request_id) is waiting
    assert table.get(read.request_id) is None and read.dropped and read.result is None
    assert table.get(fresh.request_id) is fresh
    for _ in range(MAX_KEPT_RESULTS + 10):
        op = Op("forward", {})
        op.resolve({})
        table.add(op)
    assert len(table) <= MAX_KEPT_RESULTS and table.get(waiting.request_id) is waiting


def test_the_dedupe_window_keeps_what_is_not_answered() -> None:
    model = Model("p", Session("s", {}), 0, Op("create_model", {}))
    first = Op("forward", {}, seq=1)
    model.remember(first)
    for seq in range(2, DEDUPE_WINDOW + 10):
        op = Op("forward", {}, seq=seq)
        op.resolve({})
        model.remember(op)
    assert 1 in model.ops  # unanswered: still known
    first.resolve({})
    model.remember(Op("forward", {}, seq=DEDUPE_WINDOW + 20))
    assert 1 not in model.ops and len(model.ops) <= DEDUPE_WINDOW + 1


def test_a_request_is_digested_when_a_resend_needs_it_and_kept_until_read() -> None:
    body = {"model_id": "m", "seq_id": 3, "type": "optim_step", "adam_params": {"lr": 1e-3}}
    twin = {**body, "type": None, "adam_params": {"lr": 0.001}}  # the same, another way
    op = Op("optim_step", body)
    assert op._digest is None  # noqa: SLF001 - nothing hashed on the way in
    assert op.digest == canonical_digest(twin, ignore=("type",))
    unread = Op("optim_step", dict(body))
    unread.release()  # its ticket may have been lost: a resend must still find it
    assert unread.digest == op.digest and unread.body == {}
    read = Op("optim_step", dict(body))
    read.first_read = time.monotonic()
    read.release()  # answered and read: no SDK resends it, so it is not hashed now
    assert read.digest is None


def test_json_bodies_carry_no_arrays() -> None:
    body = {"a": np.arange(3), "b": [np.float32(1.5), {"c": np.int64(2)}], "d": (1, 2)}
    assert jsonable(body) == {"a": [0, 1, 2], "b": [1.5, {"c": 2}], "d": [1, 2]}


# ----------------------------------------------------------------- the redo log's cut


def _core() -> Core:
    return Core(None, _settings(), lambda event: None, settle)  # type: ignore[arg-type]


def _logged(core: Core, model: Model, op: str, *, done: bool = True) -> Op:
    entry = Op(op, {"model_id": model.program_id}, model=model)
    log_op(model, entry)
    if done:
        entry.resolve({})
    return entry


def _checkpoint(model: Model) -> Checkpoint:
    def saved() -> Op:
        op = Op("save_weights", {}, internal=True)
        op.outcome_ok = True
        return op

    return Checkpoint(
        name="step-x",
        step=model.step,
        lpos=model.lpos,
        wver=model.wver,
        trainer_job_id="j",
        state_op=saved(),
        sampler_op=saved(),
        ref="accounts/a/rlorTrainerJobs/j/checkpoints/step-x",
        record=CheckpointRecord(name="n", step=model.step, trainer_job_id="j", sampler="n-sampler"),
    )


def test_a_checkpoint_cuts_the_redo_log_once_everything_before_it_is_answered() -> None:
    core = _core()
    model = Model("p", Session("s", {}), 0, Op("create_model", {}))
    _logged(core, model, "forward_backward")
    step1 = _logged(core, model, "optim_step", done=False)
    ckpt = _checkpoint(model)
    model.pending.append(ckpt)
    after = _logged(core, model, "forward_backward")
    truncate(core, model)
    assert model.checkpoint is None and len(model.redo) == 3  # step 1 is not answered yet
    step1.resolve({})
    truncate(core, model)
    assert model.checkpoint is ckpt and model.redo == [after] and not model.pending
    assert step1.body == {}  # out of the log for good: its body is let go


def test_gradients_not_yet_applied_stay_in_the_redo_log() -> None:
    """A checkpoint holds weights and optimizer state, not accumulated gradients: the
    forward_backwards since the last optimizer step are redone after it."""
    core = _core()
    model = Model("p", Session("s", {}), 0, Op("create_model", {}))
    _logged(core, model, "forward_backward")
    _logged(core, model, "optim_step")
    pending_grad = _logged(core, model, "forward_backward")
    forward = _logged(core, model, "forward")
    model.pending.append(_checkpoint(model))
    truncate(core, model)
    assert model.redo == [pending_grad]
    assert needs_redo(pending_grad) and not needs_redo(forward)


def test_a_snapshot_leaving_the_log_is_made_from_the_checkpoint_its_start_or_lost() -> None:
    """Snapshots that leave the redo log stay live on their trainer; for a later one they
    are made from the checkpoint's sampler twin (same weights), from the base model (a new
    model's first weights: a frozen reference, as DPO keeps), or lost (other weights)."""
    core = _core()
    session = Session("s", {})
    model = Model("p", session, 0, Op("create_model", {}))
    first = _logged(core, model, "save_weights_for_sampler")  # at weights version 0
    _logged(core, model, "forward_backward")
    _logged(core, model, "optim_step")
    middle = _logged(core, model, "save_weights_for_sampler")  # at version 1
    _logged(core, model, "forward_backward")
    _logged(core, model, "optim_step")
    same = _logged(core, model, "save_weights_for_sampler")  # at the checkpoint's
    for name, snap in (("first", first), ("middle", middle), ("same", same)):
        sampler = Sampler(name, session, "snapshot", model=model, snap_op=snap)
        snap.sampler = sampler
        add_sampler(core, sampler)
    model.pending.append(_checkpoint(model))
    truncate(core, model)
    samplers = core.samplers
    assert samplers["first"].lost is None and samplers["first"].kind == "base"
    assert samplers["first"].base_model == core.settings.trainer_base_model
    # Between the two: made again from the model as made (no restore point before it) and
    # the operations up to it, which are kept for it.
    middle = samplers["middle"]
    assert middle.lost is None and middle.kind == "remade" and middle.recipe is not None
    assert middle.recipe.base is None
    assert [op.op for op in middle.recipe.ops] == ["forward_backward", "optim_step"]
    assert all(op.body for op in middle.recipe.ops)  # not let go
    assert samplers["same"].lost is None and samplers["same"].kind == "path"
    assert samplers["same"].trainer_path == "n-sampler"

    # A model the program loaded from a checkpoint: its first weights are the load's.
    loaded = Model("q", session, 1, Op("load_weights", {"path": "tinker://r/weights/x"}))
    snap = _logged(core, loaded, "save_weights_for_sampler")
    _logged(core, loaded, "forward_backward")
    _logged(core, loaded, "optim_step")
    sampler = Sampler("loaded", session, "snapshot", model=loaded, snap_op=snap)
    snap.sampler = sampler
    add_sampler(core, sampler)
    loaded.pending.append(_checkpoint(loaded))
    truncate(core, loaded)
    assert sampler.lost is None and sampler.kind == "remade" and sampler.recipe is not None
    assert sampler.recipe.ops == [] and sampler.recipe.base is None


def test_only_the_most_recently_used_snapshots_keep_their_recipes() -> None:
    """A snapshot per step (an RL loop's) does not keep every interval's operations: beyond
    the most recently used few, a snapshot is lost for a later trainer, its operations let go."""
    from shepherd.proxy.settings import MAX_REMADE_SNAPSHOTS

    core = _core()
    session = Session("s", {})
    model = Model("p", session, 0, Op("create_model", {}))
    snaps = []
    for step in range(MAX_REMADE_SNAPSHOTS + 2):
        _logged(core, model, "forward_backward")
        _logged(core, model, "optim_step")
        snap = _logged(core, model, "save_weights_for_sampler")
        sampler = Sampler(f"s{step}", session, "snapshot", model=model, snap_op=snap)
        snap.sampler = sampler
        add_sampler(core, sampler)
        snaps.append(sampler)
    _logged(core, model, "forward_backward")
    _logged(core, model, "optim_step")
    model.pending.append(_checkpoint(model))
    truncate(core, model)
    kept = [s for s in snaps if s.recipe is not None]
    assert kept == snaps[-MAX_REMADE_SNAPSHOTS:]
    assert all(s.lost is not None and s.recipe is None for s in snaps[:-MAX_REMADE_SNAPSHOTS])
