"""What a job's proxy is told (:class:`ProxySettings`) and the bounds it keeps by itself
(declared constants, each with the reason for its number)."""

from __future__ import annotations

from typing import Final

from pydantic import BaseModel, ConfigDict, Field

from shepherd.platform import rules

# ------------------------------------------------------------------------- declared bounds

#: Request bodies the proxy reads from a program: the trainer's own data-plane limit
#: (localplane's ``DATA_PLANE_MAX_BODY_BYTES``), so nothing the trainer would take is refused
#: here, and nothing it would refuse is buffered first.
MAX_BODY_BYTES: Final = 64 * 1024 * 1024

#: How long the proxy holds a program's ``retrieve_future`` open while the work is pending
#: before answering ``try_again``: what localplane's trainers hold (20 s), well inside the
#: SDKs' 45 s poll timeout, so a poll never times out client-side (a timeout is a retry with
#: backoff; a try_again is an immediate re-poll).
RETRIEVE_HOLD_S: Final = 20.0

#: How long a direct call (``get_info``, ``create_sampling_session``, the REST surface) waits
#: for a trainer while none is attached before it is answered 503 (which both SDKs retry for
#: ~5 minutes): below the tinker SDK's 60 s request timeout, so the program sees a clean
#: retryable answer rather than its own timeout.
DIRECT_HOLD_S: Final = 45.0

#: Results of answered futures are kept this long after the program first read them: a
#: read whose answer was lost in transit is retried within seconds; nothing reads an answer
#: a minute later.
RESULT_KEEP_AFTER_READ_S: Final = 60.0
#: ... and at most this long unread (the trainer's own result TTL, localplane's
#: ``RESULT_TTL_S``): a program that never reads a result (a fire-and-forget save) does not
#: hold its memory forever.
RESULT_TTL_S: Final = 3600.0
#: At most this many results are kept at once, oldest finished first out (never one not yet
#: finished): a pipelining program keeps a handful in flight; the trainer keeps 4,096 loose
#: futures for the same reason.
MAX_KEPT_RESULTS: Final = 4096
#: A model remembers its last this-many operations for dedupe (same ``seq_id``, same body:
#: the same future), the trainer's own window (localplane's ``SEQUENCE_WINDOW``).
DEDUPE_WINDOW: Final = 1024
#: A later ``seq_id`` waits this long for a missing earlier one before the model is broken:
#: the trainer's own hold (``rules.SEQ_GAP_HOLD_S``), so the proxy is no stricter and no
#: laxer than the trainer the program would otherwise talk to.
SEQ_GAP_HOLD_S: Final = rules.SEQ_GAP_HOLD_S
#: The redo log never holds more operations than this, whatever the checkpoint interval:
#: past it the proxy takes a checkpoint at the next optimizer step (a program that runs
#: many operations per step, or a very long interval, still has a bounded log). 4,096
#: operations of a typical SFT step (a forward_backward and an optim_step) is 2,048 steps.
MAX_REDO_OPS: Final = 4096
#: Program sampling sessions remembered (least recently used out): an RL program takes a
#: new sampler every step; the trainer itself keeps 32. A forgotten one answers a clear 400.
MAX_SAMPLERS: Final = 4096
#: Snapshots (of weights between two checkpoints) the proxy can make again after a trainer
#: loss, the most recently used: each keeps the operations from the restore point before it
#: to it (at most a checkpoint interval of batches). A program keeps one or two such samplers
#: (a reference, a teacher); an RL loop's per-step samplers are used once and let go.
MAX_REMADE_SNAPSHOTS: Final = 4
#: Tokens of sampled sequences whose log-probabilities the proxy keeps for provenance spans
#: (~8 bytes each: 32 MiB). An RL step's spans name what it sampled in the same or the last
#: few steps; a step of 64 prompts x 8 samples x 1,000 tokens is 0.5 M.
MAX_KEPT_SEQUENCE_TOKENS: Final = 4_000_000
#: Steps of history kept in :class:`~shepherd.proxy.events.ProxyProgress` (losses and
#: digests): the workflow receives every step as an event, so this is only for a look at
#: recent progress; 10,000 floats and hashes are ~1 MB.
PROGRESS_HISTORY: Final = 10_000
#: How often the proxy sweeps its tables by age.
SWEEP_EVERY_S: Final = 30.0
#: After a connection error or 5xx from the trainer's route while the control plane says
#: RUNNING, the call is sent again after this long (a gateway blip), within the call's own
#: timeout.
TRANSIENT_RETRY_S: Final = 0.2
#: The first route-race retry never waits less than this (the workflow's warm-up probe
#: spacing: routes reach gateway replicas within tens to hundreds of milliseconds).
MIN_ROUTE_RACE_DELAY_S: Final = 0.02
#: When the trainer itself is asked for a future's result, each poll is held this long at
#: most by the HTTP client (the trainer holds it ~20 s and answers ``try_again``).
TRAINER_POLL_TIMEOUT_S: Final = 45.0


#: The file in ``state_dir`` that keeps the program's checkpoint paths (one JSON line each).
IDS_FILE: Final = "proxy-ids.jsonl"


class ProxySettings(BaseModel):
    """How one job's proxy runs. Built by the worker from the job's spec and policies;
    nothing here is a secret."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    #: The base model the job's trainer was created for. A program's ``create_model`` (or
    #: sampler) for another base model is refused with an error naming both.
    trainer_base_model: str = Field(min_length=1)
    #: Other names a program may give that base model (a cookbook recipe names it by the
    #: Hugging Face name it picks its tokenizer and renderer by: the registration's
    #: ``model_arg``); the trainer is sent its own name.
    base_model_aliases: tuple[str, ...] = ()
    #: The LoRA rank the trainer was created for (0: full-parameter). A program's model of
    #: another rank is refused naming both; None accepts any rank (a trainer that serves
    #: several, as localplane's does).
    lora_rank: int | None = Field(default=None, ge=0, le=rules.MAX_LORA_RANK)
    #: Shepherd's checkpoint every this many optimizer steps (the job's
    #: ``checkpoint.every_steps``); it bounds the redo log.
    checkpoint_every: int = Field(ge=1)
    #: Shepherd names its checkpoints ``{prefix}{step:08d}`` (``step-00000040``), the
    #: promotable twin ``…-sampler``, as loops' checkpoints are named.
    checkpoint_prefix: str = Field(default="step-", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,40}$")
    #: Bound of one operation on the trainer (a save, a step; the job's ``step_timeout``):
    #: a restore waits this long for each operation it redoes.
    call_timeout_s: float = Field(default=300.0, gt=0)
    #: The route race (trainer-api.md §5): a data-plane 404 while the control plane says
    #: RUNNING is re-sent (same trainer ``seq_id``) at most this many times, with doubling
    #: delays that add up to ``route_race_window_s`` (the job's ``policies``).
    route_race_retries: int = Field(default=4, ge=0, le=32)
    route_race_window_s: float = Field(default=30.0, gt=0, le=rules.ROUTE_RACE_WINDOW_MAX_S)
    #: Ask the trainer for the model's weights digest after every optimizer step (localplane
    #: reports one in ``get_info``; a trainer that does not is asked once).
    record_digests: bool = True
    #: See :data:`RETRIEVE_HOLD_S` and :data:`DIRECT_HOLD_S` (tests shorten them).
    retrieve_hold_s: float = Field(default=RETRIEVE_HOLD_S, gt=0, le=40.0)
    direct_hold_s: float = Field(default=DIRECT_HOLD_S, gt=0, le=55.0)
    #: Which of the program's models is the job's (its steps, checkpoints, promotion):
    #: ``last`` (the newest model the program has trained: a pipeline's final stage), ``first``,
    #: or the 1-based number of the model in the order the program made them.
    follow: str = Field(default="last", pattern=r"^(last|first|[1-9][0-9]{0,5})$")
    #: The job's durable log directory: the proxy keeps the program's checkpoint paths there
    #: (:data:`IDS_FILE`), so the proxy of a program started again (its worker died) reads
    #: the paths the program wrote down as the first proxy gave them. None: kept in memory.
    state_dir: str | None = None

    def checkpoint_name(self, step: int, model_index: int = 0) -> str:
        """Shepherd's name of the checkpoint at ``step`` of the program's first model
        (``model_index`` 0); its further models' get their number as a suffix (``-m3``: the
        third model the program made, as ``status`` numbers it), so names never collide."""
        name = f"{self.checkpoint_prefix}{step:08d}"
        return name if model_index == 0 else f"{name}-m{model_index + 1}"

    def race_delay(self, race: int) -> float:
        """Seconds before route-race retry ``race`` (1-based): growing geometrically from
        :data:`MIN_ROUTE_RACE_DELAY_S` so that all ``route_race_retries`` delays add up to
        ``route_race_window_s`` (4 in 30 s: 0.02, 0.23, 2.5, 27 s). The workflow's
        ``policies.route_race_delay`` doubles from a 1 s floor, which suits an activity
        retry; a request held inside the proxy is better retried at once, since a route
        reaches the gateway's replicas within tens to hundreds of milliseconds, and only
        then more and more patiently."""
        retries = max(1, self.route_race_retries)
        return MIN_ROUTE_RACE_DELAY_S * _ratio(retries, self.route_race_window_s) ** (race - 1)


def _ratio(n: int, window: float) -> float:
    """r with MIN + MIN r + ... + MIN r^(n-1) = window (1 when n delays of MIN fill it)."""
    if n * MIN_ROUTE_RACE_DELAY_S >= window:
        return 1.0
    low, high = 1.0, window / MIN_ROUTE_RACE_DELAY_S
    for _ in range(100):  # bisection: the sum grows with r
        mid = (low + high) / 2
        total = MIN_ROUTE_RACE_DELAY_S * sum(mid**k for k in range(n))
        low, high = (mid, high) if total < window else (low, mid)
    return low
