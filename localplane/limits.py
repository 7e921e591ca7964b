"""Every bound localplane enforces, in one place, each with the reason for its number.

A trainer runs for days: every table it keeps per session or per call is bounded here by
count and by age, so its memory stays flat however long an RL loop runs (bench/trainer_memory.py
measures it). Request bodies are bounded before they are parsed, and a trainer declares a
memory budget, so an impossible request is a 4xx naming the field, never a MemoryError.

Plain constants (no imports): the trainer process loads this module at start-up.
"""

from __future__ import annotations

from typing import Final

MiB: Final = 1 << 20

# --------------------------------------------------------------------- request bodies

#: Control plane and admin API: job specs, promotions, deployments, faults — a few KiB each.
#: 1 MiB leaves three orders of magnitude of room and refuses a 100 MB body before it is read.
CONTROL_PLANE_MAX_BODY_BYTES: Final = 1 * MiB
#: Data plane (gateway and trainers). The tinker SDK cuts forward_backward into chunks of at
#: most 5 MB of protobuf (ClientConfigResponse.fwdbwd_max_chunk_bytes_count) and the Fireworks
#: fork into 5 MB estimated; the same chunk as JSON text (a float as ~10 characters, not 4
#: bytes) runs to ~25 MB. 64 MiB holds that with room and bounds what one request can cost.
DATA_PLANE_MAX_BODY_BYTES: Final = 64 * MiB
#: Inference (deployment completions, hot-load): token prompts, like a sample request.
INFERENCE_MAX_BODY_BYTES: Final = 8 * MiB
#: Longest value an error message echoes back: enough to recognise an id, never the 25 MB
#: string a client sent by mistake.
ECHO_CHARS: Final = 120
#: Longest error message a server sends at all (a backstop behind ECHO_CHARS).
MAX_ERROR_MESSAGE_CHARS: Final = 2000

# ------------------------------------------------------------------- trainer memory

#: What one trainer process may hold in models (weights, Adam moments, accumulated
#: gradients) and sampler snapshots. The stand-in model at rank 1024 is ~25 MB; 2 GiB lets a
#: trainer hold dozens of models and samplers and refuses a lora_rank of 10^9 (1.8 TiB) as a
#: 400 at create_model instead of a MemoryError in its future.
TRAINER_MEMORY_BUDGET_BYTES: Final = 2 << 30
#: Models one trainer holds at once. Loops use one or two (policy, reference); a session that
#: leaks a model per step hits this and gets a clear 429 instead of growing without bound.
MAX_MODELS: Final = 64

# ------------------------------------------------------------------------ sessions

#: Sessions one trainer keeps. A client opens one per ServiceClient; 256 is far above any
#: real workload and bounds what a misbehaving client (a session per request) can pin.
MAX_SESSIONS: Final = 256
#: A session with no call (no heartbeat, no operation on its models or samplers) for this
#: long is gone, with its models and samplers: the SDKs heartbeat every ~10 s while alive, and
#: a loop paused for hours keeps its session by heartbeating. 6 h survives a long evaluation
#: or a laptop sleeping over lunch, and frees an abandoned session's memory the same day.
SESSION_IDLE_S: Final = 6 * 3600
#: Largest user_metadata a session or model may carry (entries, and characters per key or
#: value): metadata names a run (renderer, wandb link), it is not a blob store.
MAX_METADATA_ENTRIES: Final = 64
MAX_METADATA_CHARS: Final = 1024

# ------------------------------------------------------------------------ samplers

#: Sampler snapshots (a copy of a model's weights each) one trainer keeps, least recently
#: used first out. An RL loop makes one per step and samples from the newest; off-policy
#: loops reach a few steps back (the cookbook's max_steps_off_policy is single digits). 32
#: covers that and caps the per-step snapshots that made a 10,000-step loop grow.
MAX_SAMPLERS: Final = 32
#: A sampler nobody sampled from for this long is dropped even under the count bound.
SAMPLER_IDLE_S: Final = 3600
#: Identical-request counters per sampler (the default sampling seed counts how often the
#: same request met the same weights, trainer-api.md §7). A GRPO group repeats one prompt
#: 4-64 times; 16,384 distinct prompts per sampler covers a large batch, and an evicted
#: counter only makes a far-later repeat of an old prompt sample like its first occurrence.
MAX_SAMPLE_OCCURRENCES: Final = 16_384
#: Sampled sequences recorded for provenance (record_stability_info), trainer-wide, least
#: recently used first out. A datum names sequences of the last few sampling rounds: an
#: on-policy step trains on the round it just sampled, the cookbook's async RL reaches back
#: max_steps_off_policy rounds (single digits). 16,384 is 8 rounds of a large GRPO batch
#: (128 groups x 16 samples); entries are compact arrays (~0.5 KB at 64 tokens), so the
#: table stays under ~10 MB. An hour after its last use a sequence is no longer needed by
#: any loop whose steps take minutes.
MAX_RECORDED_SEQUENCES: Final = 16_384
RECORDED_SEQUENCE_TTL_S: Final = 3600

# ------------------------------------------------------------------------- futures

#: Operations a model remembers for dedupe (and, while fresh, with their results). Clients
#: pipeline tens of operations and Shepherd replays at most the steps of one chunk; 1,024
#: covers any of them many times over.
SEQUENCE_WINDOW: Final = 1024
#: How long a finished operation's result is kept for retrieval. Clients retrieve at once;
#: the slowest legitimate re-request is Shepherd replaying a chunk after a worker died or a
#: route race (heartbeat timeout + retry, or the route-race window: minutes at most). After
#: an hour only the dedupe record stays: a replay of that seq_id is refused with a 400 that
#: says so — never handed a request_id that would then answer 410.
RESULT_TTL_S: Final = 3600
#: Futures not tied to a model's sequence (create_model, samples) kept for retrieval and
#: dedupe, oldest finished first out; unfinished ones are never dropped.
MAX_LOOSE_FUTURES: Final = 4096

# --------------------------------------------------------------------- housekeeping

#: How often a trainer sweeps its tables by age (sessions, samplers, results, recorded
#: sequences). Ages are minutes to hours; a sweep a minute keeps memory within a minute of
#: its bound at the cost of one pass over small tables.
TRAINER_SWEEP_S: Final = 60.0
#: How often the plane deletes expired checkpoint files. Readers treat an expired
#: checkpoint as gone at once; the sweep only frees the disk, so a minute is plenty.
CHECKPOINT_SWEEP_S: Final = 60.0
