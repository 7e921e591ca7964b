"""The Tinker training client a loop gets under Shepherd.

Same methods and the same ``tinker.types`` as the tinker SDK's ``TrainingClient`` and
``SamplingClient`` (``forward_backward``, ``forward``, ``optim_step``, ``save_state``,
``save_weights_for_sampler``, ``save_weights_and_get_sampling_client``, ``sample``,
``get_tokenizer`` …; each returns an awaitable ``APIFuture`` at once, so calls pipeline),
so a loop written for Tinker moves over by changing only how it obtains its client.

Why not hand loops a real SDK client: Shepherd must own every operation's ``seq_id``.
An activity that dies (worker crash, route race, trainer 5xx) is retried from the last
heartbeated ``(step, seq_id)``, re-sends the very same operations with the very same
``seq_id``s, and the trainer dedupes on ``(model_id, seq_id)`` — so nothing is applied
twice and the weights end bit-identical. The SDKs number operations themselves and start
over in a new process; they also treat a route 404 as fatal (trainer-api.md §5), and the
tinker SDK speaks the protobuf dialect hosted trainers do not. Underneath is
:class:`~shepherd.platform.client.TrainerClient`, the JSON dialect.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
from collections.abc import Awaitable, Callable, Generator, Mapping, Sequence
from typing import Any, Generic, TypeVar

import numpy as np
from tinker import types

from shepherd.platform.client import TrainerClient
from shepherd.platform.models import TrainerModelInfo

T = TypeVar("T")


class APIFuture(Generic[T]):
    """A submitted operation: ``await`` it (or ``await f.result_async()``)."""

    def __init__(self, task: asyncio.Future[T]) -> None:
        self._task = task

    def __await__(self) -> Generator[Any, None, T]:
        return self._task.__await__()

    async def result_async(self, timeout: float | None = None) -> T:
        return await asyncio.wait_for(asyncio.shield(self._task), timeout)

    def result(self, timeout: float | None = None) -> T:
        # The SDK's blocking .result() would deadlock the event loop the loop runs on.
        raise RuntimeError(
            "loops run inside Shepherd's event loop: use `await future` "
            "(or `await future.result_async()`) instead of .result()"
        )

    def done(self) -> bool:
        return self._task.done()


# ------------------------------------------------------------------ wire conversions

#: Dtypes of well-known loss inputs given as plain lists (as the tinker SDK infers them).
_INT_KEYS = {"target_tokens"}
_FLOAT_KEYS = {"weights", "advantages", "logprobs", "clip_low_threshold", "clip_high_threshold"}


def tensor_json(value: Any, key: str = "") -> dict[str, Any]:
    """A ``TensorData`` (or array, list) as the JSON dialect's ``{data, dtype, shape}``."""
    if isinstance(value, dict) and "data" in value and "dtype" in value:
        return value
    if not isinstance(value, types.TensorData):
        array = np.asarray(value)
        integral = key in _INT_KEYS or (key not in _FLOAT_KEYS and array.dtype.kind in "iub")
        value = types.TensorData.from_numpy(array.astype(np.int64 if integral else np.float32))
    if value.sparse_crow_indices is not None:
        raise ValueError(f"{key or 'tensor'}: sparse TensorData is not supported; send it dense")
    array = value.to_numpy()
    return {"data": array.reshape(-1).tolist(), "dtype": value.dtype, "shape": list(array.shape)}


def tensor_from(value: Any) -> Any:
    if isinstance(value, dict) and "data" in value and "dtype" in value:
        return types.TensorData(data=value["data"], dtype=value["dtype"], shape=value.get("shape"))
    return value


def model_input_json(model_input: Any) -> dict[str, Any]:
    if isinstance(model_input, dict):
        return model_input
    if isinstance(model_input, Sequence) and not isinstance(model_input, str):
        return {"chunks": [{"type": "encoded_text", "tokens": [int(t) for t in model_input]}]}
    chunks = []
    for chunk in model_input.chunks:
        kind = getattr(chunk, "type", "encoded_text")
        if kind != "encoded_text":
            raise ValueError(f"model_input: chunks of type {kind!r} are not supported")
        chunks.append({"type": "encoded_text", "tokens": [int(t) for t in chunk.tokens]})
    return {"chunks": chunks}


def datum_json(datum: Any) -> dict[str, Any]:
    if isinstance(datum, dict):
        return datum
    return {
        "model_input": model_input_json(datum.model_input),
        "loss_fn_inputs": {k: tensor_json(v, k) for k, v in datum.loss_fn_inputs.items()},
    }


def params_json(params: Any) -> dict[str, Any]:
    if params is None:
        return {}
    if isinstance(params, Mapping):
        return dict(params)
    return dict(params.model_dump(exclude_none=True))


def forward_backward_output(raw: dict[str, Any]) -> types.ForwardBackwardOutput:
    return types.ForwardBackwardOutput(
        loss_fn_output_type=str(raw.get("loss_fn_output_type") or "ArrayRecord"),
        loss_fn_outputs=[
            {k: tensor_from(v) for k, v in out.items()} for out in raw.get("loss_fn_outputs", [])
        ],
        metrics={k: float(v) for k, v in (raw.get("metrics") or {}).items()},
    )


def sample_response(raw: dict[str, Any]) -> types.SampleResponse:
    sequences = [
        types.SampledSequence(
            stop_reason=seq.get("stop_reason", "length"),
            sequence_id=str(seq.get("sequence_id", i)),
            _tokens_list=[int(t) for t in seq.get("tokens", [])],
            _logprobs_list=seq.get("logprobs"),
        )
        for i, seq in enumerate(raw.get("sequences", []))
    ]
    return types.SampleResponse(
        sequences=sequences, _prompt_logprobs_list=raw.get("prompt_logprobs")
    )


#: asample seq_ids per model position (see ``TrainingClient._next_sample_seq``).
SAMPLES_PER_OP = 1 << 20


def sampling_session_seq_id(model_id: str, model_path: str) -> int:
    """The sampling session of a sampler checkpoint: a function of (model, path), so that
    an activity replaying a step meets the sampler it created before, and a later step's
    checkpoint never gets an earlier one's (the trainer keys sampling sessions on
    ``(session_id, sampling_session_seq_id)``; a counter restarting in every activity would
    hand chunk 2 the weights chunk 1 sampled from). 53 bits: exact in any JSON reader."""
    digest = hashlib.sha256(f"{model_id}\x1f{model_path}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 11


@functools.cache
def load_tokenizer(name: str) -> Any:
    """A Hugging Face tokenizer by id or local directory (cached per worker process)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(name)


# ---------------------------------------------------------------------- the clients


class TrainingClient:
    """One model on one trainer, driven with Tinker's API. ``next_seq`` is the ``seq_id``
    the next sequenced operation gets; Shepherd records it at every step boundary."""

    def __init__(
        self,
        trainer: TrainerClient,
        *,
        session_id: str,
        model_id: str,
        base_model: str,
        next_seq: int,
        timeout: float,
        info: TrainerModelInfo | None = None,
        tokenizer_id: str | None = None,
    ) -> None:
        self.trainer = trainer
        self.tokenizer_id = tokenizer_id
        self.session_id = session_id
        self.model_id = model_id
        self.base_model = base_model
        self.next_seq = next_seq
        self.timeout = timeout
        self._info = info
        #: Everything submitted and not yet settled: sequenced operations and samples alike,
        #: so that a step boundary (``drain``) is one in fact.
        self._pending: set[asyncio.Future[Any]] = set()
        #: Sequenced operations the trainer has not yet confirmed receiving, by seq_id.
        self._unconfirmed: dict[int, tuple[str, dict[str, Any]]] = {}
        #: optim_step operations handed a seq_id so far (each one is a training step).
        self.optim_steps = 0
        self._sample_mark = (next_seq, 0)

    # -- sequenced operations ----------------------------------------------------

    def _sequenced(
        self, op: str, body: dict[str, Any], convert: Callable[[dict[str, Any]], T]
    ) -> APIFuture[T]:
        seq, self.next_seq = self.next_seq, self.next_seq + 1
        body = {**body, "model_id": self.model_id, "seq_id": seq}
        self._unconfirmed[seq] = (op, body)
        if op == "optim_step":
            self.optim_steps += 1

        async def run() -> T:
            request_id = await self.trainer.submit(op, body, deadline=self.timeout)
            self._unconfirmed.pop(seq, None)
            return convert(await self.trainer.result(request_id, timeout=self.timeout))

        return APIFuture(self._track(asyncio.ensure_future(run())))

    def _track(self, task: asyncio.Future[T]) -> asyncio.Future[T]:
        self._pending.add(task)
        task.add_done_callback(self._settled)
        return task

    def _settled(self, task: asyncio.Future[Any]) -> None:
        self._pending.discard(task)
        # Mark the error as seen: a loop that stopped at an earlier error never awaits
        # the operations behind it, and their errors are the same story.
        if not task.cancelled():
            task.exception()

    def forward_backward(
        self,
        data: list[Any],
        loss_fn: str,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> APIFuture[types.ForwardBackwardOutput]:
        return self._sequenced(
            "forward_backward",
            {"forward_backward_input": self._fb_input(data, loss_fn, loss_fn_config)},
            forward_backward_output,
        )

    def forward(
        self,
        data: list[Any],
        loss_fn: str,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> APIFuture[types.ForwardBackwardOutput]:
        return self._sequenced(
            "forward",
            {"forward_input": self._fb_input(data, loss_fn, loss_fn_config)},
            forward_backward_output,
        )

    @staticmethod
    def _fb_input(
        data: list[Any], loss_fn: str, config: Mapping[str, float | str] | None
    ) -> dict[str, Any]:
        body: dict[str, Any] = {"data": [datum_json(d) for d in data], "loss_fn": loss_fn}
        if config:
            body["loss_fn_config"] = dict(config)
        return body

    def optim_step(
        self, optim_params: Any = None, *, adam_params: Any = None
    ) -> APIFuture[types.OptimStepResponse]:
        params = params_json(optim_params if optim_params is not None else adam_params)
        # The optimizer family travels with its parameters, as tinker's OptimStepRequest sends
        # it: a trainer that cannot run it refuses it rather than silently running Adam.
        field = (
            "adam_params" if params.get("type") in (None, "adam", "adamw") else "optimizer_params"
        )
        return self._sequenced(
            "optim_step",
            {field: params},
            lambda raw: types.OptimStepResponse(metrics=raw.get("metrics")),
        )

    def save_state(self, name: str) -> APIFuture[types.SaveWeightsResponse]:
        return self._sequenced(
            "save_weights", {"path": name}, lambda raw: types.SaveWeightsResponse(path=raw["path"])
        )

    def save_weights_for_sampler(self, name: str) -> APIFuture[types.SaveWeightsForSamplerResponse]:
        return self._sequenced(
            "save_weights_for_sampler",
            {"path": name},
            lambda raw: types.SaveWeightsForSamplerResponse(path=raw["path"]),
        )

    def load_state(self, path: str) -> APIFuture[types.LoadWeightsResponse]:
        return self._load(path, optimizer=False)

    def load_state_with_optimizer(self, path: str) -> APIFuture[types.LoadWeightsResponse]:
        return self._load(path, optimizer=True)

    def _load(self, path: str, *, optimizer: bool) -> APIFuture[types.LoadWeightsResponse]:
        return self._sequenced(
            "load_weights",
            {"path": path, "optimizer": optimizer},
            lambda raw: types.LoadWeightsResponse(path=raw.get("path", path)),
        )

    # -- sampling -------------------------------------------------------------------

    def create_sampling_client(self, model_path: str) -> SamplingClient:
        return SamplingClient(
            self.trainer,
            session_id=self.session_id,
            sampling_session_seq_id=sampling_session_seq_id(self.model_id, model_path),
            model_path=model_path,
            base_model=self.base_model,
            timeout=self.timeout,
            tokenizer_name=self.tokenizer_name,
            next_sample_seq=self._next_sample_seq,
            track=self._track,
        )

    def _next_sample_seq(self) -> int:
        """An ``asample`` seq_id: the model's position (``next_seq``) and the count of samples
        submitted since it last moved. The trainer dedupes samples on (sampler, seq_id), so
        these must repeat exactly when a step is replayed and never repeat otherwise; a
        per-client counter would restart at 1 in every activity and get old answers."""
        seq, count = self._sample_mark
        if seq != self.next_seq:
            seq, count = self.next_seq, 0
        self._sample_mark = (seq, count + 1)
        return seq * SAMPLES_PER_OP + count

    async def create_sampling_client_async(self, model_path: str) -> SamplingClient:
        return self.create_sampling_client(model_path)

    async def save_weights_and_get_sampling_client_async(
        self, name: str | None = None
    ) -> SamplingClient:
        """Save the current weights for sampling and sample from them: under ``name`` (a
        checkpoint; a re-sent save is the same checkpoint), or, without a name, as an
        ephemeral sampler of this session (nothing on the control plane; gone with the
        trainer). The ephemeral sampler's id derives from the save's ``seq_id``, so a replayed
        save meets the same sampler and a new model's saves never meet an old one's."""
        if name is not None:
            saved = await self.save_weights_for_sampler(name)
            return self.create_sampling_client(saved.path)
        sampler_seq = sampling_session_seq_id(self.model_id, f"anonymous:{self.next_seq}")
        sampling_session_id = await self._sequenced(
            "save_weights_for_sampler",
            {"sampling_session_seq_id": sampler_seq},
            lambda raw: str(raw["sampling_session_id"]),
        )
        return SamplingClient(
            self.trainer,
            session_id=self.session_id,
            sampling_session_seq_id=sampler_seq,
            model_path=None,
            base_model=self.base_model,
            timeout=self.timeout,
            tokenizer_name=self.tokenizer_name,
            next_sample_seq=self._next_sample_seq,
            sampling_session_id=sampling_session_id,
            track=self._track,
        )

    # -- information ----------------------------------------------------------------

    async def get_info_async(self) -> TrainerModelInfo:
        self._info = await self.trainer.get_info(self.model_id)
        return self._info

    @property
    def tokenizer_name(self) -> str:
        info = self._info
        tokenizer_id = self.tokenizer_id or (info.model_data.tokenizer_id if info else None)
        return tokenizer_id or (info.model_data.model_name if info else None) or self.base_model

    def get_tokenizer(self) -> Any:
        return load_tokenizer(self.tokenizer_name)

    async def drain(self) -> None:
        """Wait for every operation and sample submitted so far (the step's boundary)."""
        while self._pending:
            await asyncio.gather(*list(self._pending))

    async def confirm_submitted(self) -> None:
        """Make sure the trainer holds every operation handed a ``seq_id`` so far, sending
        again (same ``seq_id``, same body: the trainer dedupes) any whose submission was not
        confirmed. Once a step is abandoned (a pause or a cancel stopped it), the trainer
        still applies, in ``seq_id`` order, whatever of it reached it; a ``seq_id`` that
        never did would hold every later operation of the model, the next save included."""
        for seq in sorted(self._unconfirmed):
            op, body = self._unconfirmed[seq]
            await self.trainer.submit(op, body, deadline=self.timeout)
            self._unconfirmed.pop(seq, None)

    def cancel_pending(self) -> None:
        for task in list(self._pending):
            task.cancel()

    # -- the SDK's deprecated async spellings, for loops written against them ---------

    async def forward_backward_async(
        self, data: list[Any], loss_fn: str, loss_fn_config: Any = None
    ) -> APIFuture[types.ForwardBackwardOutput]:
        return self.forward_backward(data, loss_fn, loss_fn_config)

    async def forward_async(
        self, data: list[Any], loss_fn: str, loss_fn_config: Any = None
    ) -> APIFuture[types.ForwardBackwardOutput]:
        return self.forward(data, loss_fn, loss_fn_config)

    async def optim_step_async(
        self, optim_params: Any = None, *, adam_params: Any = None
    ) -> APIFuture[types.OptimStepResponse]:
        return self.optim_step(optim_params, adam_params=adam_params)

    async def save_weights_for_sampler_async(
        self, name: str
    ) -> APIFuture[types.SaveWeightsForSamplerResponse]:
        return self.save_weights_for_sampler(name)


class SamplingClient:
    """Samples from one sampler checkpoint (``model_path``) on the same trainer, or from an
    existing sampling session (``sampling_session_id``, e.g. an ephemeral sampler)."""

    def __init__(
        self,
        trainer: TrainerClient,
        *,
        session_id: str,
        sampling_session_seq_id: int,
        model_path: str | None,
        base_model: str,
        timeout: float,
        next_sample_seq: Callable[[], int],
        tokenizer_name: str | None = None,
        sampling_session_id: str | None = None,
        track: Callable[[asyncio.Future[Any]], asyncio.Future[Any]] | None = None,
    ) -> None:
        self.trainer = trainer
        #: Registers a sample with its training client, whose step boundary waits for it.
        self._track = track or (lambda task: task)
        self.session_id = session_id
        self.sampling_session_seq_id = sampling_session_seq_id
        self._next_sample_seq = next_sample_seq
        self.model_path = model_path
        self.base_model = base_model
        self.tokenizer_name = tokenizer_name or base_model
        self.timeout = timeout
        self._session: asyncio.Future[str] | None = None
        if sampling_session_id is not None:
            self._session = asyncio.get_running_loop().create_future()
            self._session.set_result(sampling_session_id)

    def _sampling_session(self) -> Awaitable[str]:
        if self._session is None:
            self._session = asyncio.ensure_future(
                self.trainer.create_sampling_session(
                    self.session_id, self.sampling_session_seq_id, model_path=self.model_path
                )
            )
        return asyncio.shield(self._session)

    def sample(
        self,
        prompt: Any,
        num_samples: int,
        sampling_params: Any,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
    ) -> APIFuture[types.SampleResponse]:
        body: dict[str, Any] = {
            "num_samples": num_samples,
            "prompt": model_input_json(prompt),
            "sampling_params": params_json(sampling_params),
            "seq_id": self._next_sample_seq(),
            "type": "sample",
        }
        if include_prompt_logprobs:
            body["prompt_logprobs"] = True
            body["topk_prompt_logprobs"] = topk_prompt_logprobs

        async def run() -> types.SampleResponse:
            session = await self._sampling_session()
            raw = await self.trainer.call(
                "asample", {**body, "sampling_session_id": session}, timeout=self.timeout
            )
            return sample_response(raw)

        return APIFuture(self._track(asyncio.ensure_future(run())))

    async def sample_async(
        self, prompt: Any, num_samples: int, sampling_params: Any, **kwargs: Any
    ) -> types.SampleResponse:
        return await self.sample(prompt, num_samples, sampling_params, **kwargs)

    def get_tokenizer(self) -> Any:
        return load_tokenizer(self.tokenizer_name)
