"""Sampling: sampler snapshots, ``asample``, the default seed, and recorded sequences.

* A *sampler* is frozen weights to sample from: a named sampler checkpoint, a snapshot of a
  model (``save_weights_for_sampler`` without a name), or the base model. Bounded: least
  recently used out beyond ``MAX_SAMPLERS``, and any unused for ``SAMPLER_IDLE_S``.
* ``asample`` answers with a future whose ticket names one ``sequence_id`` per sample. A
  retry of ``(sampler, seq_id)`` gets the same future; with a different body it is refused.
* **The default seed** (no ``sampling_params.seed``) is a function of what identifies the
  request across a replay, never of a random request id: the sampler's weights digest, the
  request's content, its ``seq_id`` when the client numbers its requests (both SDKs do, in
  call order), and how many identical requests met these weights before. A step replayed
  on a new trainer from a checkpoint samples exactly what it sampled the first time, and
  GRPO's repeated identical prompts still get different samples.
* With ``record_stability_info`` every sampled sequence is recorded (its prompt, tokens and
  the sampler's log-probabilities; bounded by age and count, ``limits``), so training
  requests can name it (``Datum.loss_fn_input_spans``): StableReinforce then trains against
  the log-probabilities the sampler really had.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from localplane import limits
from localplane.errors import FailedPrecondition, InvalidArgument, shorten
from localplane.trainer import checkpoints as ckpts
from localplane.trainer import validate
from localplane.trainer.backend import PromptTopk, SamplerWeights, SampleSettings
from localplane.trainer.context import TrainerContext
from localplane.trainer.errors import UserError
from localplane.trainer.futures import Future
from localplane.trainer.lm import stable_seed
from shepherd.tinker_wire.dialects import canonical_digest
from shepherd.tinker_wire.values import Datum, Span

#: Fields of a sample request that name where it goes rather than what it asks.
_ADDRESSING = ("sampling_session_id", "seq_id", "type", "model_path", "base_model")


@dataclass(eq=False)
class Sampler:
    sampler_id: str
    session_id: str
    base_model: str
    model_path: str | None
    weights: SamplerWeights
    digest: str
    nbytes: int
    last_used: float = field(default_factory=time.monotonic)
    #: Identical-request counts: (content digest, seq_id) -> times seen.
    occurrences: OrderedDict[tuple[str, Any], int] = field(default_factory=OrderedDict)

    def occurrence(self, key: tuple[str, Any]) -> int:
        seen = self.occurrences.pop(key, 0)
        self.occurrences[key] = seen + 1
        while len(self.occurrences) > limits.MAX_SAMPLE_OCCURRENCES:
            self.occurrences.popitem(last=False)
        return seen

    def wire(self) -> dict[str, Any]:
        return {
            "sampler_id": self.sampler_id,
            "base_model": self.base_model,
            "model_path": self.model_path,
        }


@dataclass(slots=True)
class Recorded:
    """A sampled sequence kept for provenance, compactly: tens of thousands are kept, and the
    samples of one request share their prompt array."""

    session_id: str
    prompt: np.ndarray  # int32, shared by the request's samples
    tokens: np.ndarray  # int32
    logprobs: np.ndarray  # float64, as the sampler computed them
    last_used: float = field(default_factory=time.monotonic)


#: One (token id, logprob) pair of ``SampleResponse.topk_prompt_logprobs``.
_TOPK_PAIR = np.dtype([("token_id", np.int64), ("logprob", np.float64)])


def topk_wire(topk: PromptTopk) -> list[np.ndarray | None]:
    """``SampleResponse.topk_prompt_logprobs``: for every prompt position, None where nothing
    was scored (the first position, and those before ``prompt_logprobs_last_n``) or its k
    (token id, logprob) pairs, most likely first. Each row is a structured view into one
    array — the answer waits in memory until retrieved, and a long prompt's Python tuples
    would be ~10x larger — which the JSON encoder writes as ``[[id, logprob], ...]`` and the
    protobuf dialect packs as the SDK's TopkLogprobs matrices."""
    pairs = np.empty(topk.token_ids.shape, dtype=_TOPK_PAIR)
    pairs["token_id"] = topk.token_ids
    pairs["logprob"] = topk.logprobs
    return [None] * topk.first + list(pairs)


def default_seed(weights_digest: str, content: str, seq_id: Any, occurrence: int) -> int:
    return stable_seed("localplane-sample", weights_digest, content, seq_id, occurrence)


class Samplers:
    def __init__(self, ctx: TrainerContext) -> None:
        self.ctx = ctx
        self._samplers: OrderedDict[str, Sampler] = OrderedDict()
        #: (sampler_id, seq_id) -> the future of that sample request (dedupe).
        self._calls: dict[tuple[str, int], Future] = {}
        self._recorded: OrderedDict[str, Recorded] = OrderedDict()

    def __len__(self) -> int:
        return len(self._samplers)

    @property
    def recorded(self) -> int:
        return len(self._recorded)

    def nbytes(self) -> int:
        return sum(s.nbytes for s in self._samplers.values())

    # --------------------------------------------------------------------- samplers

    def register(
        self, sampler_id: str, session_id: str, model_path: str | None, weights: SamplerWeights
    ) -> Sampler:
        """Keep a sampler (on the event loop); the least recently used ones make room."""
        known = self._samplers.get(sampler_id)
        if known is not None:
            return known
        digest = self.ctx.backend.digest(weights)
        nbytes = self.ctx.backend.sampler_bytes(weights)
        sampler = Sampler(
            sampler_id, session_id, weights.base_model, model_path, weights, digest, nbytes
        )
        self._samplers[sampler_id] = sampler
        session = self.ctx.sessions.find(session_id)
        if session is not None:
            session.samplers.add(sampler_id)
        self._trim(time.monotonic())
        return sampler

    def get(self, sampler_id: Any) -> Sampler:
        sampler = self._samplers.get(sampler_id) if isinstance(sampler_id, str) else None
        if sampler is None:
            raise FailedPrecondition(
                f"sampling session {shorten(sampler_id)} is not on this trainer (sampling sessions "
                "do not survive a trainer restart, and the least recently used are dropped); "
                "create a new one"
            )
        sampler.last_used = time.monotonic()
        self._samplers.move_to_end(sampler.sampler_id)
        self.ctx.sessions.touch(sampler.session_id)
        return sampler

    def forget(self, sampler_id: str) -> None:
        sampler = self._samplers.pop(sampler_id, None)
        if sampler is None:
            return
        session = self.ctx.sessions.find(sampler.session_id)
        if session is not None:
            session.samplers.discard(sampler_id)

    def make_room(self, nbytes: int) -> None:
        """Drop least recently used samplers until ``nbytes`` more fit the memory budget."""
        while (
            self._samplers and self.ctx.bytes_in_use() + nbytes > limits.TRAINER_MEMORY_BUDGET_BYTES
        ):
            self.forget(next(iter(self._samplers)))

    def _trim(self, now: float) -> None:
        while len(self._samplers) > limits.MAX_SAMPLERS:
            self.forget(next(iter(self._samplers)))
        for sampler in list(self._samplers.values()):
            if now - sampler.last_used > limits.SAMPLER_IDLE_S:
                self.forget(sampler.sampler_id)

    def sweep(self, now: float) -> None:
        self._trim(now)
        for seq_id, rec in list(self._recorded.items()):
            if now - rec.last_used > limits.RECORDED_SEQUENCE_TTL_S:
                del self._recorded[seq_id]

    def forget_session(self, session_id: str) -> None:
        for sampler in list(self._samplers.values()):
            if sampler.session_id == session_id:
                self.forget(sampler.sampler_id)
        for seq_id, rec in list(self._recorded.items()):
            if rec.session_id == session_id:
                del self._recorded[seq_id]

    def _weights_from(self, model_path: Any, base_model: Any) -> tuple[SamplerWeights, str | None]:
        """Frozen weights of a checkpoint (any kind) or, without a path, the base model."""
        ctx = self.ctx
        if model_path:
            meta = ckpts.resolve(model_path, ctx.caller())
            exported = ckpts.read(ctx.cfg.data_dir, meta)
            if exported.base_model != ctx.cfg.base_model:
                raise UserError(
                    f"model_path: checkpoint {meta.checkpoint} was trained from "
                    f"{exported.base_model!r}; this trainer serves {ctx.cfg.base_model!r}"
                )
            return ctx.backend.sampler_from(exported), str(model_path)
        validate.base_model(base_model, ctx.cfg.base_model)
        return ctx.backend.base_sampler(ctx.cfg.base_model), None

    async def create_sampling_session(self, body: dict[str, Any]) -> dict[str, Any]:
        ctx = self.ctx
        with validate.as_http():
            session = ctx.sessions.get(validate.text(body, "session_id"))
            seq = validate.integer(body, "sampling_session_seq_id", required=True)
        sampler_id = f"{session.session_id}:sample:{seq}"
        if sampler_id not in self._samplers:
            with validate.as_http():
                weights, path = await ctx.compute.call(
                    lambda: self._weights_from(body.get("model_path"), body.get("base_model"))
                )
            self.make_room(0)
            self.register(sampler_id, session.session_id, path, weights)
        return {"type": "create_sampling_session", "sampling_session_id": sampler_id}

    # ------------------------------------------------------------------------ asample

    def asample(self, body: dict[str, Any]) -> dict[str, Any]:
        ctx = self.ctx
        sampler_id = body.get("sampling_session_id")
        raw_seq = body.get("seq_id")
        numbered = isinstance(raw_seq, int) and not isinstance(raw_seq, bool)
        seq_id: int | None = raw_seq if numbered else None
        content = canonical_digest(body, ignore=_ADDRESSING)
        key = (sampler_id, seq_id) if isinstance(sampler_id, str) and seq_id is not None else None
        if key is not None and key in self._calls:
            known = self._calls[key]
            if known.digest != content:
                raise FailedPrecondition(
                    f"seq_id {seq_id} of sampling session {shorten(sampler_id)} was already used "
                    "by a different sample request (its body differs from this one's); a retry "
                    "must resend the same request, and a new request needs a new seq_id"
                )
            return known.ticket()
        with validate.as_http():
            settings = validate.sampling(
                body,
                vocab=ctx.backend.vocab_size,
                max_context=ctx.cfg.max_context_length,
                encode=ctx.backend.encode,
            )
            record = validate.flag(body, "record_stability_info")
        sampler = self.get(sampler_id) if sampler_id is not None else None
        if sampler is None and not (body.get("model_path") or body.get("base_model")):
            raise InvalidArgument(
                "sampling_session_id: is required (or model_path / base_model for a one-off sample)"
            )
        explicit = (body.get("sampling_params") or {}).get("seed")
        fut = Future("asample", digest=content)
        fut.extra["sample_sequence_ids"] = [
            f"{fut.request_id}:{i}" for i in range(settings.num_samples)
        ]
        ctx.futures.add(fut, loose=True)
        if key is not None:
            self._calls[key] = fut
            fut.on_forget.append(functools.partial(self._drop_call, key))
        # Counted here, on the event loop, in submission order: what the seed depends on.
        occurrence = sampler.occurrence((content, seq_id)) if sampler else 0
        session_id = sampler.session_id if sampler else None

        def run() -> dict[str, Any]:
            weights, digest = (sampler.weights, sampler.digest) if sampler else self._one_off(body)
            seed = explicit
            if seed is None:
                seed = default_seed(digest, content, seq_id, occurrence)
            return self._sample(weights, settings, int(seed), fut, session_id if record else None)

        ctx.compute.spawn(fut, run)
        return fut.ticket()

    def _drop_call(self, key: tuple[str, int], _: Future) -> None:
        self._calls.pop(key, None)

    def _one_off(self, body: dict[str, Any]) -> tuple[SamplerWeights, str]:
        weights, _ = self._weights_from(body.get("model_path"), body.get("base_model"))
        return weights, self.ctx.backend.digest(weights)

    def _sample(
        self,
        weights: SamplerWeights,
        settings: SampleSettings,
        seed: int,
        fut: Future,
        record_for: str | None,
    ) -> dict[str, Any]:
        backend = self.ctx.backend
        samples = backend.sample(weights, settings, seed)
        sequences = [
            {"tokens": s.tokens, "logprobs": s.logprobs, "stop_reason": s.stop_reason}
            for s in samples
        ]
        result: dict[str, Any] = {"type": "sample", "sequences": sequences, "prompt_logprobs": None}
        if settings.prompt_logprobs:
            result["prompt_logprobs"] = backend.prompt_logprobs(
                weights, settings.prompt, settings.prompt_logprobs_last_n
            )
        if settings.topk_prompt_logprobs:
            topk = backend.prompt_topk(
                weights,
                settings.prompt,
                settings.topk_prompt_logprobs,
                settings.prompt_logprobs_last_n,
            )
            result["topk_prompt_logprobs"] = topk_wire(topk)
        if record_for is not None:
            prompt = np.asarray(settings.prompt, dtype=np.int32)
            recorded = [
                (
                    seq_id,
                    Recorded(
                        record_for,
                        prompt,
                        np.asarray(s.tokens, dtype=np.int32),
                        np.asarray(s.logprobs, dtype=np.float64),
                    ),
                )
                for seq_id, s in zip(fut.extra["sample_sequence_ids"], samples, strict=True)
            ]
            self.ctx.after(lambda: self._record(recorded))
        return result

    def _record(self, recorded: list[tuple[str, Recorded]]) -> None:
        for seq_id, rec in recorded:
            self._recorded[seq_id] = rec
        while len(self._recorded) > limits.MAX_RECORDED_SEQUENCES:
            self._recorded.popitem(last=False)

    # --------------------------------------------------------------------- provenance

    def resolve_provenance(self, datums: list[Datum], session_id: str) -> list[Datum]:
        """Datums whose ``logprobs`` are the recorded sampler log-probabilities wherever
        their provenance names a sampled sequence; every claim is checked against what was
        recorded (tokens, offsets, session). Runs on the event loop, at submission."""
        out = []
        for index, datum in enumerate(datums):
            if datum.target_spans is None:
                out.append(datum)
                continue
            where = f"data[{index}]"
            self._check_spans(
                datum.tokens, datum.input_spans or [], f"{where}.model_input_spans", session_id
            )
            target = datum.inputs.get("target_tokens")
            if target is None:
                raise UserError(f"{where}: loss_fn_inputs is missing 'target_tokens'")
            if target.ndim != 1:
                raise UserError(
                    f"{where}.loss_fn_inputs.target_tokens: has shape {list(target.shape)}; "
                    "provenance spans name one sampled token per position (shape [T])"
                )
            sent = datum.inputs.get("logprobs")
            q = (
                np.full(len(target), np.nan)
                if sent is None
                else np.asarray(sent, dtype=np.float64).copy()
            )
            pos = 0
            for i, span in enumerate(datum.target_spans):
                at = f"{where}.loss_fn_input_spans[{i}]"
                rec = self._lookup(span, at, session_id)
                source = rec.tokens if span.kind == "sampled_tokens" else rec.prompt
                self._check_run(target[pos : pos + span.length], source, span, at)
                if span.kind == "sampled_tokens":
                    q[pos : pos + span.length] = rec.logprobs[
                        span.offset : span.offset + span.length
                    ]
                pos += span.length
            adv = datum.inputs.get("advantages")
            uncovered = np.isnan(q)
            if adv is not None and np.any(uncovered & (np.asarray(adv) != 0)):
                first = int(np.flatnonzero(uncovered & (np.asarray(adv) != 0))[0])
                raise UserError(
                    f"{where}: position {first} has an advantage but no sampler log-probability: "
                    "name its sampled sequence in loss_fn_input_spans or send logprobs"
                )
            q[uncovered] = 0.0
            out.append(dataclasses.replace(datum, inputs={**datum.inputs, "logprobs": q}))
        return out

    def _check_spans(
        self, tokens: np.ndarray, spans: list[Span], where: str, session_id: str
    ) -> None:
        pos = 0
        for i, span in enumerate(spans):
            at = f"{where}[{i}]"
            rec = self._lookup(span, at, session_id)
            source = rec.tokens if span.kind == "sampled_tokens" else rec.prompt
            self._check_run(tokens[pos : pos + span.length], source, span, at)
            pos += span.length

    def _lookup(self, span: Span, at: str, session_id: str) -> Recorded:
        rec = self._recorded.get(span.sequence_id)
        if rec is None or rec.session_id != session_id:
            raise UserError(
                f"{at}.sequence_id: {shorten(span.sequence_id)} is not a sequence this session "
                "sampled with record_stability_info=True (or it was forgotten: sequences are kept "
                f"{limits.RECORDED_SEQUENCE_TTL_S}s after their last use, the newest "
                f"{limits.MAX_RECORDED_SEQUENCES} at most)"
            )
        rec.last_used = time.monotonic()
        self._recorded.move_to_end(span.sequence_id)
        return rec

    @staticmethod
    def _check_run(got: np.ndarray, source: np.ndarray, span: Span, at: str) -> None:
        end = span.offset + span.length
        if end > len(source):
            raise UserError(
                f"{at}: offset {span.offset} + length {span.length} exceeds the {len(source)} "
                f"{span.kind.replace('_', ' ')} of sequence {shorten(span.sequence_id)}"
            )
        if not np.array_equal(np.asarray(got, dtype=np.int64), source[span.offset : end]):
            raise UserError(
                f"{at}: the datum's tokens differ from the {span.kind.replace('_', ' ')} of "
                f"sequence {shorten(span.sequence_id)} at [{span.offset}, {end})"
            )
