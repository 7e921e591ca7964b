"""Blocking helpers for the real-SDK tests: the SDKs are synchronous clients (they run their
own event loop in a thread), so these tests talk to the plane with a plain blocking httpx
client too — control plane, admin API and route warm-up — and never block an asyncio loop."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from localplane.process import PlaneProcess

#: A corpus the byte-level stand-in LM learns quickly: the loss must visibly fall in a few steps.
CORPUS = ["hello world\n", "hello there\n", "hello hello\n", "world hello\n"]
BASE_MODEL = "accounts/fireworks/models/qwen3-8b"

#: Bounds for one SDK call's result, so a broken plane fails a test instead of hanging it
#: (the SDKs retry for minutes by default).
RESULT_TIMEOUT = 60.0


@dataclass
class SdkAccount:
    id: str
    api_key: str


class PlaneHttp:
    """The plane's control plane and admin API, blocking."""

    def __init__(self, plane: PlaneProcess) -> None:
        self.url = plane.url
        self._admin = httpx.Client(
            base_url=plane.url,
            headers={"Authorization": f"Bearer {plane.admin_key}"},
            timeout=30.0,
        )
        self._users: dict[str, httpx.Client] = {}
        self._jobs: set[tuple[str, str]] = set()
        self._accounts: dict[str, SdkAccount] = {}

    def close(self) -> None:
        # Whatever a failed test left running is deleted, so no trainer outlives it.
        for account_id, job_id in sorted(self._jobs):
            with contextlib.suppress(Exception):  # cleanup must reach every job
                self.delete_job(self._accounts[account_id], job_id)
        self._admin.close()
        for client in self._users.values():
            client.close()

    def _user(self, account: SdkAccount) -> httpx.Client:
        if account.api_key not in self._users:
            self._users[account.api_key] = httpx.Client(
                base_url=self.url, headers={"X-Api-Key": account.api_key}, timeout=30.0
            )
        return self._users[account.api_key]

    # -------------------------------------------------------------------- admin

    def new_account(self, key_style: str) -> SdkAccount:
        """A fresh account and a minted key (`tinker`: `tml-…`, `fireworks`: `fw_…`)."""
        answer = self._admin.post("/admin/v1/accounts", json={"keyStyle": key_style})
        answer.raise_for_status()
        body = answer.json()
        account = SdkAccount(body["account"]["name"].removeprefix("accounts/"), body["apiKey"])
        self._accounts[account.id] = account
        return account

    def preempt(self, account: SdkAccount, job_id: str) -> None:
        answer = self._admin.post(
            f"/admin/v1/rlorTrainerJobs/{job_id}:preempt", params={"account": account.id}
        )
        answer.raise_for_status()

    def set_faults(self, **fields: Any) -> None:
        self._admin.post("/admin/v1/faults", json=fields).raise_for_status()

    @contextmanager
    def faults(self, **fields: Any) -> Iterator[None]:
        """The plane's operating config changed for a block, then restored as it was."""
        before = self._admin.get("/admin/v1/faults").json()
        self.set_faults(**fields)
        try:
            yield
        finally:
            self.set_faults(**{name: before[name] for name in fields})

    def stats(self) -> dict[str, Any]:
        answer = self._admin.get("/admin/v1/stats")
        answer.raise_for_status()
        return answer.json()

    def data_plane(self, account: SdkAccount, job_id: str) -> dict[str, int]:
        """Requests the job's trainers served, by `"<dialect>:<op>"`."""
        job = self.stats()["jobs"].get(f"accounts/{account.id}/rlorTrainerJobs/{job_id}", {})
        return job.get("dataPlane", {})

    def route_404s(self, account: SdkAccount, job_id: str) -> int:
        job = self.stats()["jobs"].get(f"accounts/{account.id}/rlorTrainerJobs/{job_id}", {})
        return int(job.get("route404s", 0))

    # ------------------------------------------------------------ control plane

    def create_job(
        self, account: SdkAccount, job_id: str, *, lora_rank: int, base_model: str = BASE_MODEL
    ) -> dict[str, Any]:
        body = {
            "displayName": job_id,
            "serviceMode": True,
            "trainingConfig": {
                "baseModel": base_model,
                "loraRank": lora_rank,
                "learningRate": 1e-2,
            },
        }
        answer = self._user(account).post(
            f"/v1/accounts/{account.id}/rlorTrainerJobs",
            params={"rlorTrainerJobId": job_id},
            json=body,
        )
        answer.raise_for_status()
        self._jobs.add((account.id, job_id))
        return answer.json()

    def job(self, account: SdkAccount, job_id: str) -> dict[str, Any]:
        answer = self._user(account).get(f"/v1/accounts/{account.id}/rlorTrainerJobs/{job_id}")
        answer.raise_for_status()
        return answer.json()

    def resume(self, account: SdkAccount, job_id: str) -> None:
        self._user(account).post(
            f"/v1/accounts/{account.id}/rlorTrainerJobs/{job_id}:resume"
        ).raise_for_status()

    def delete_job(self, account: SdkAccount, job_id: str) -> None:
        answer = self._user(account).delete(f"/v1/accounts/{account.id}/rlorTrainerJobs/{job_id}")
        if answer.status_code != 404:
            answer.raise_for_status()
        self.wait_state(account, job_id, "JOB_STATE_DELETED")
        self._jobs.discard((account.id, job_id))

    def adopt_job(self, account: SdkAccount, job_id: str) -> None:
        """A job created by an SDK: deleted at close() unless the test deleted it."""
        self._jobs.add((account.id, job_id))

    def wait_state(
        self, account: SdkAccount, job_id: str, *states: str, timeout: float = 30.0
    ) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            job = self.job(account, job_id)
            if job["state"] in states:
                return job
            if time.monotonic() > deadline:
                raise AssertionError(f"{job_id} stayed {job['state']}, wanted {states}")
            time.sleep(0.05)

    def trainer_tables(self, account: SdkAccount, job_id: str) -> dict[str, Any]:
        """The trainer's table sizes and loss usage (localplane's healthz extension)."""
        answer = self._user(account).get(f"{self.trainer_base_url(account, job_id)}/api/v1/healthz")
        answer.raise_for_status()
        return answer.json()["tables"]

    def sweep_checkpoints(self) -> int:
        answer = self._admin.post("/admin/v1/checkpoints:sweep")
        answer.raise_for_status()
        return int(answer.json()["changed"])

    def checkpoint_ids(self, account: SdkAccount, job_id: str) -> list[str]:
        answer = self._user(account).get(
            f"/v1/accounts/{account.id}/rlorTrainerJobs/{job_id}/checkpoints",
            params={"pageSize": 1000},
        )
        answer.raise_for_status()
        return [c["name"].rsplit("/", 1)[-1] for c in answer.json()["checkpoints"]]

    def trainer_base_url(self, account: SdkAccount, job_id: str) -> str:
        """The trainer's base URL, as TrainerJobManager hands it out (trainer-api.md §4)."""
        return f"{self.url}/training/v1/rlorTrainerJobs/{account.id}/{job_id}"

    def warm(self, account: SdkAccount, base_url: str, *, timeout: float = 30.0) -> int:
        """Probe healthz over the training route until every gateway replica answered twice in
        a row (§5: one 200 proves nothing about the next request); returns the 404s seen."""
        replicas = int(self._admin.get("/admin/v1/faults").json().get("gatewayReplicas", 3))
        need = 2 * replicas
        ok = seen_404 = 0
        deadline = time.monotonic() + timeout
        client = self._user(account)
        while ok < need:
            if time.monotonic() > deadline:
                raise AssertionError(f"route to {base_url} never warmed up")
            status = client.get(f"{base_url}/api/v1/healthz").status_code
            if status == 200:
                ok += 1
            elif status == 404:
                ok = 0
                seen_404 += 1
                time.sleep(0.02)
            else:
                raise AssertionError(f"healthz answered {status} during warm-up")
        return seen_404


@contextmanager
def plane_http(plane: PlaneProcess) -> Iterator[PlaneHttp]:
    http = PlaneHttp(plane)
    try:
        yield http
    finally:
        http.close()


def byte_datums(types: Any, texts: list[str]) -> list[Any]:
    """Next-token datums over raw bytes (the stand-in LM's vocabulary), built with the SDK's
    own types module (`tinker.types` or `fireworks.training.sdk`)."""
    datums = []
    for text in texts:
        tokens = list(text.encode())
        datums.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={
                    "target_tokens": types.TensorData(
                        data=tokens[1:], dtype="int64", shape=[len(tokens) - 1]
                    ),
                    "weights": types.TensorData(
                        data=[1.0] * (len(tokens) - 1), dtype="float32", shape=[len(tokens) - 1]
                    ),
                },
            )
        )
    return datums
