"""Shepherd's data-plane proxy: an unmodified Tinker program, durable.

A program job runs a whole Tinker program — a tinker-cookbook recipe, a user's ``tinker``
script, a ``FiretitanServiceClient`` loop — that builds its own client from
``TINKER_BASE_URL`` / ``TINKER_API_KEY`` and owns its loop. Shepherd cannot re-run a step of
it, so it sits on the wire instead: the program's base URL is a :class:`ProgramProxy` of its
own job, and the program never talks to a trainer::

    program ──Tinker API (protobuf or JSON)──▶ ProgramProxy ──JSON dialect──▶ the job's trainer
                                                │ redo log since the last checkpoint
                                                │ program ids ⇄ this trainer's ids
                                                └ steps, losses, checkpoints → events

**How does a program survive a preemption?** As a database survives a crash: checkpoint
plus redo log.

1. *Checkpoint.* Every ``checkpoint_every`` optimizer steps the proxy inserts, right after
   the program's ``optim_step`` in the trainer's sequence, Shepherd's own ``save_weights``
   (weights and optimizer state: resumable) named ``step-00000040`` and its promotable twin
   ``save_weights_for_sampler`` ``step-00000040-sampler`` — with trainer ``seq_id``\\ s the
   program never sees (the proxy owns the trainer's numbering; the program's own numbering
   is mapped onto it). Once both are saved and every operation before them answered, that
   checkpoint is the *restore point* and the redo log is cut there (:mod:`.checkpoints`).
2. *Redo log.* Every operation the program sent since the restore point is kept, in order
   (forward_backward, optim_step, loads, saves, snapshots for sampling), with the answer
   the program got, if it got one. It is bounded by the checkpoint interval
   (:data:`~shepherd.proxy.settings.MAX_REDO_OPS` at most).
3. *The trainer dies.* The proxy sees it (a route 404 or a failing connection that the
   control plane confirms is not the route race: a ``trainer_lost`` event) or the lifecycle
   tells it (:meth:`ProgramProxy.detach`). From then on the program's requests wait: futures
   answer ``try_again`` as a queued hosted service does, submissions are logged and get
   their future at once, direct calls are held.
4. *A new trainer is attached* (:meth:`ProgramProxy.attach`, after the lifecycle resumed the
   job, or made a new one after a pause, waited for RUNNING and warmed the route up). Each
   model is loaded from its restore point with optimizer state into a new model (or created
   again exactly as the program created it, before the first checkpoint), and its redo log
   is sent again in order. Training is bit-reproducible, so the weights are those the lost
   trainer had (``AttachResult.digests_match`` says so when the trainer reports digests).
   Answers the program already has are not sent again; operations it still waits for are
   answered now. Sample requests the lost trainer had not answered are sent again on the
   sampler made again from the same weights: the trainer's default seed is a function of
   the weights and the request, so the answer is the one the program would have had.
5. *The program's ids stay.* Sessions, models, sampling sessions, futures and sampled
   sequences are the proxy's (:mod:`.ids`), mapped onto each trainer generation's; the
   program's view does not change. Checkpoint paths are the platform's (they outlive the
   job).

Exactly once: a program's resent request (same ``seq_id``, same body) gets the same
future; a different body at a used ``seq_id`` is refused, as the trainer refuses it. Every
optimizer step is applied once to the weights the program ends with (the redo starts from
the checkpoint that holds everything before it). The route race (a 404 while the job is
RUNNING) is resent with the same trainer ``seq_id``, bounded, and never reaches the program
(:mod:`.upstream`). The platform's key stays with the proxy; the program holds a per-job
``tml-`` token (:attr:`ProgramProxy.api_key`).

Public API (what the lead's ``run_program`` activity uses)::

    proxy = ProgramProxy(platform, ProxySettings(...), on_event=...)
    await proxy.start()                    # proxy.url, proxy.api_key -> the program's env
    await proxy.attach(trainer_job_id)     # -> AttachResult; again after every recovery
    proxy.detach(reason)                   # the trainer is gone / about to be deleted
    await proxy.checkpoint_now()           # pause: checkpoint, then detach -> CheckpointRecord
    proxy.progress                         # ProxyProgress: step, losses, checkpoints, ...
    await proxy.close()

Events (``on_event``): :class:`StepEvent`, :class:`CheckpointEvent`,
:class:`TrainerLostEvent` (the :data:`ProxyEvent` union). Layout: :mod:`.proxy` (this API),
:mod:`.api` (each endpoint as the program sees it), :mod:`.app` (HTTP, auth, dialects);
:mod:`.core` (the shared state: the program's tables, the generation, the job's model) and
what the proxy does with it, a module each: :mod:`.operations` (sent), :mod:`.answers`
(settled), :mod:`.redo` (the redo log), :mod:`.restore` (a model made live, restored),
:mod:`.checkpoints` (Shepherd's, and the log's truncation), :mod:`.snapshots`,
:mod:`.samplers`, :mod:`.spans`, :mod:`.steps` (steps, losses, digests);
:mod:`.upstream` (the trainer, the route race), :mod:`.ids`, :mod:`.state`,
:mod:`.settings` (every bound, with its reason), :mod:`.events`.

What a program keeps across Shepherd's checkpoints and a trainer loss: every sampler it
holds stays live on the trainer that has it; on a new trainer a sampler is made again from
its base model, its checkpoint path, a snapshot in the redo log, a checkpoint's sampler twin,
the base model (a snapshot of a new model's first weights: a frozen reference, as DPO keeps)
or a *recipe* (any other snapshot that left the redo log: the restore point before it and
the operations since, sent again to a scratch model) — kept for the
:data:`~shepherd.proxy.settings.MAX_REMADE_SNAPSHOTS` most recently used such snapshots; an
older one cannot be made again after a loss (a clear 400 names it). Provenance spans
(``stable_reinforce``'s recorded sequences) travel as the ``logprobs`` they name, which the proxy kept from the samples: they mean the same on every
trainer. ``tinker://`` paths are the platform's own: they work in any job of the account,
after this one ended. The job's model is kept on the trainer after the program finishes its
session, so the final checkpoint holds the weights the program ended with. A direct call held
longer than :data:`~shepherd.proxy.settings.DIRECT_HOLD_S` is answered 503, which the SDKs
retry.
"""

from shepherd.proxy.events import (
    AttachResult,
    CheckpointEvent,
    ProxyEvent,
    ProxyProgress,
    StepEvent,
    TrainerLostEvent,
)
from shepherd.proxy.proxy import ProgramProxy, ProxyError
from shepherd.proxy.settings import ProxySettings

__all__ = [
    "AttachResult",
    "CheckpointEvent",
    "ProgramProxy",
    "ProxyError",
    "ProxyEvent",
    "ProxyProgress",
    "ProxySettings",
    "StepEvent",
    "TrainerLostEvent",
]
