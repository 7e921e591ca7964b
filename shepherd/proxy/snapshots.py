"""What becomes of a sampler snapshot (a ``save_weights_for_sampler`` the program sampled
from) when the restore point passes it and it leaves the redo log: it stays live on the
trainer that has it, and a later trainer makes it again from the checkpoint's sampler twin,
from the base model, or from a *recipe* — or cannot (the sampler is *lost*).

The samplers are made again from what is decided here by :mod:`.samplers`.
"""

from __future__ import annotations

from shepherd.proxy.core import Core
from shepherd.proxy.settings import MAX_REMADE_SNAPSHOTS
from shepherd.proxy.state import Checkpoint, Model, Op, Recipe

#: Operations that change a model's state: what a snapshot's recipe sends again.
_STATE_OPS = frozenset({"forward_backward", "optim_step", "load_weights"})


def left_log(
    core: Core,
    model: Model,
    ckpt: Checkpoint,
    before: list[Op],
    gone: list[Op],
    prev: Checkpoint | None,
) -> None:
    """Snapshots leaving the redo log (each stays live on this trainer), and how a later
    trainer makes each again: from the checkpoint's sampler twin when they hold its
    weights; from the base model when they hold a new model's first weights (a frozen
    reference, as DPO keeps); else from a recipe — the restore point before them and the
    operations since, sent again to a scratch model — for the most recently used few
    (:data:`MAX_REMADE_SNAPSHOTS`); the rest are lost for a later trainer."""
    left = {id(op) for op in gone}
    for sampler in list(core.samplers.values()):
        snap = sampler.snap_op
        if sampler.model is not model or snap is None or id(snap) not in left:
            continue
        sampler.snap_op = None
        if snap.wver == ckpt.wver:
            sampler.kind = "path"
            sampler.trainer_path = ckpt.record.sampler
        elif snap.wver == 0 and model.create.op == "create_model":
            # A new model's first weights are its base model's: LoRA adapters start at
            # zero (B = 0), and a full fine-tune starts from the base weights.
            sampler.kind = "base"
            sampler.base_model = core.settings.trainer_base_model
        else:
            cut = snap.lpos if snap.lpos is not None else 0
            ops = [
                op for op in before if op.lpos is not None and op.lpos < cut and op.op in _STATE_OPS
            ]
            sampler.kind = "remade"
            sampler.recipe = Recipe(model, prev, ops)
    _bound_recipes(core)


def pinned(core: Core) -> set[int]:
    """Operations a remade snapshot's recipe needs (kept out of release)."""
    return {id(op) for s in core.samplers.values() if s.recipe for op in s.recipe.ops}


def _bound_recipes(core: Core) -> None:
    """Keep the recipes of the most recently used remade snapshots; the others' samplers
    cannot be made again after a loss (their operations are let go)."""
    remade = [s for s in core.samplers.values() if s.recipe is not None]
    for sampler in remade[: max(0, len(remade) - MAX_REMADE_SNAPSHOTS)]:
        sampler.recipe = None
        sampler.lost = (
            f"sampling session {sampler.program_id} was a snapshot of weights between two "
            f"of Shepherd's checkpoints, and {MAX_REMADE_SNAPSHOTS} more recently used "
            "ones are what the proxy keeps the means to make again: after the trainer was "
            "replaced it cannot be made again — save the weights for the sampler anew"
        )
