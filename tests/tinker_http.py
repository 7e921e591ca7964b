"""A deliberately plain client of the Tinker API's JSON dialect (trainer-api.md §4), written
against the wire and nothing else, so localplane's tests check the trainer's contract rather
than Shepherd's client. Raw httpx; no retries: a test sees exactly what the trainer said."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import httpx

from localplane.trainer import lm

#: Text the helpers train on: short, repetitive, so the loss falls within a few steps.
CORPUS = ["the cat sat on the mat. ", "the dog sat on the log. ", "a cat and a dog. "]


class TrainerHTTPError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"HTTP {status}: {body}")
        self.status = status
        self.body = body

    @property
    def message(self) -> str:
        return (
            str(self.body.get("error", {}).get("message", ""))
            if isinstance(self.body, dict)
            else ""
        )


class FutureFailed(Exception):
    def __init__(self, body: dict[str, Any]) -> None:
        super().__init__(f"{body.get('category')}: {body.get('error')}")
        self.error = str(body.get("error"))
        self.category = body.get("category")


def tensor(values: list[Any], dtype: str) -> dict[str, Any]:
    return {"data": values, "dtype": dtype, "shape": [len(values)]}


def datum(text: str, *, weights: list[float] | None = None) -> dict[str, Any]:
    """A next-token cross-entropy datum: inputs are the text's tokens, targets shifted by one."""
    tokens = lm.encode(text)
    inputs, targets = tokens[:-1], tokens[1:]
    return {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": inputs}]},
        "loss_fn_inputs": {
            "target_tokens": tensor(targets, "int64"),
            "weights": tensor(weights or [1.0] * len(targets), "float32"),
        },
    }


def batch(step: int, size: int = 2) -> list[dict[str, Any]]:
    """The batch of a step: a deterministic function of the step number."""
    return [datum(CORPUS[(step * size + i) % len(CORPUS)]) for i in range(size)]


class TinkerHTTP:
    """One trainer's Tinker API at ``base_url`` (the gateway route or a direct URL)."""

    def __init__(
        self, base_url: str, api_key: str | None, *, auth: str = "x-api-key", timeout: float = 60
    ) -> None:
        headers = {}
        if api_key is not None:
            headers = (
                {"X-Api-Key": api_key}
                if auth == "x-api-key"
                else {"Authorization": f"Bearer {api_key}"}
            )
        self.base_url = base_url.rstrip("/")
        self.http = httpx.AsyncClient(headers=headers, timeout=timeout)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> TinkerHTTP:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def url(self, op: str) -> str:
        return f"{self.base_url}/api/v1/{op}"

    async def raw(self, op: str, body: Any = None, *, method: str = "POST") -> httpx.Response:
        if method == "GET":
            return await self.http.get(self.url(op))
        return await self.http.post(self.url(op), json=body if body is not None else {})

    async def call(self, op: str, body: Any = None, *, method: str = "POST") -> dict[str, Any]:
        r = await self.raw(op, body, method=method)
        if r.status_code != 200:
            try:
                detail = r.json()
            except ValueError:
                detail = r.text
            raise TrainerHTTPError(r.status_code, detail)
        return r.json()

    async def result(self, ticket: dict[str, Any] | str, *, timeout: float = 60) -> dict[str, Any]:
        """Wait for a future: re-poll while the trainer answers try_again."""
        request_id = ticket if isinstance(ticket, str) else ticket["request_id"]
        async with asyncio.timeout(timeout):
            while True:
                body = await self.call("retrieve_future", {"request_id": request_id})
                if body.get("type") == "try_again":
                    continue
                if "error" in body and "category" in body:
                    raise FutureFailed(body)
                return body

    async def healthz(self) -> dict[str, Any]:
        return await self.call("healthz", method="GET")

    async def session(self) -> str:
        body = {"tags": [], "user_metadata": {}, "sdk_version": "tests", "type": "create_session"}
        return (await self.call("create_session", body))["session_id"]

    async def create_model(
        self, session_id: str, model_seq_id: int, base_model: str, *, lora_rank: int = 0
    ) -> Model:
        ticket = await self.call(
            "create_model",
            {
                "session_id": session_id,
                "model_seq_id": model_seq_id,
                "base_model": base_model,
                "lora_config": {"rank": lora_rank},
            },
        )
        model_id = (await self.result(ticket))["model_id"]
        return Model(self, model_id)

    async def load_new_model(
        self, session_id: str, model_seq_id: int, path: str, *, optimizer: bool = True
    ) -> Model:
        ticket = await self.call(
            "load_weights",
            {
                "session_id": session_id,
                "model_seq_id": model_seq_id,
                "path": path,
                "optimizer": optimizer,
            },
        )
        return Model(self, (await self.result(ticket))["model_id"])


@dataclass
class Model:
    """One model's ordered sequence: every sequenced call takes the next ``seq_id``."""

    api: TinkerHTTP
    model_id: str
    seq_id: int = 0
    tickets: list[dict[str, Any]] = field(default_factory=list)

    async def submit(self, op: str, body: dict[str, Any], *, seq_id: int | None = None) -> dict:
        if seq_id is None:
            seq_id = self.seq_id + 1
        self.seq_id = max(self.seq_id, seq_id)
        ticket = await self.api.call(op, {**body, "model_id": self.model_id, "seq_id": seq_id})
        self.tickets.append(ticket)
        return ticket

    async def run(self, op: str, body: dict[str, Any]) -> dict[str, Any]:
        return await self.api.result(await self.submit(op, body))

    async def info(self) -> dict[str, Any]:
        return await self.api.call("get_info", {"model_id": self.model_id})

    def fwdbwd_body(self, data: list[dict[str, Any]], loss_fn: str = "cross_entropy") -> dict:
        return {"forward_backward_input": {"data": data, "loss_fn": loss_fn}}

    def forward_body(self, data: list[dict[str, Any]], loss_fn: str = "cross_entropy") -> dict:
        return {"forward_input": {"data": data, "loss_fn": loss_fn}}

    @staticmethod
    def optim_body(learning_rate: float = 1e-2) -> dict[str, Any]:
        return {"adam_params": {"learning_rate": learning_rate, "beta1": 0.9, "beta2": 0.95}}

    async def train(self, first: int, last: int) -> list[float]:
        """Steps ``first..last`` (one forward_backward + one optim_step each), pipelined:
        every submission goes out before any result is awaited. Returns the losses."""
        pending = []
        for step in range(first, last + 1):
            pending.append(await self.submit("forward_backward", self.fwdbwd_body(batch(step))))
            await self.submit("optim_step", self.optim_body())
        results = [await self.api.result(t) for t in pending]
        for t in self.tickets[-2 * len(pending) :]:
            await self.api.result(t)
        return [r["metrics"]["loss:sum"] for r in results]

    async def forward_loss(self, data: list[dict[str, Any]]) -> float:
        return (await self.run("forward", self.forward_body(data)))["metrics"]["loss:sum"]

    async def save(self, name: str) -> str:
        return (await self.run("save_weights", {"path": name}))["path"]

    async def save_for_sampler(self, name: str) -> str:
        return (await self.run("save_weights_for_sampler", {"path": name}))["path"]

    async def load(self, path: str, *, optimizer: bool = True) -> dict[str, Any]:
        return await self.run("load_weights", {"path": path, "optimizer": optimizer})
