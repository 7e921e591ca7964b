"""Client of localplane's admin API (trainer-api.md §6): faults, stats, preemption,
accounts and webhooks. Used by tests, benchmarks and the demo to make failures happen on
purpose and to count what happened."""

from __future__ import annotations

from typing import Any, Self

import httpx

from shepherd.platform.client import JsonTransport, tls_context


class PlaneAdmin:
    def __init__(self, base_url: str, admin_key: str, *, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._http = httpx.AsyncClient(
            headers={"Authorization": f"Bearer {admin_key}"}, timeout=timeout, verify=tls_context()
        )
        self._t = JsonTransport(self._http)

    def __repr__(self) -> str:
        return f"PlaneAdmin({self.base_url!r})"

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    async def _call(self, method: str, path: str, body: Any = None, **params: Any) -> Any:
        return await self._t.request(
            method, f"{self.base_url}/admin/v1{path}", json_body=body, params=params
        )

    # ---------------------------------------------------------------- faults

    async def faults(self) -> dict[str, Any]:
        return await self._call("GET", "/faults")

    async def set_faults(
        self, patch: dict[str, Any] | None = None, **fields: Any
    ) -> dict[str, Any]:
        """Change the operating config; e.g. ``set_faults(capacity=2, gateway404Rate=0.1)``."""
        return await self._call("POST", "/faults", {**(patch or {}), **fields})

    async def reset_faults(self) -> dict[str, Any]:
        return await self._call("DELETE", "/faults")

    # ----------------------------------------------------------------- holds

    async def hold(self, path: str, *, method: str | None = "POST", count: int = 1) -> str:
        """Hold the next ``count`` requests whose path matches ``path`` (a regex) until
        :meth:`release`; returns the hold's id (localplane/holds.py)."""
        body = {"path": path, "method": method, "count": count}
        return str((await self._call("POST", "/holds", body))["id"])

    async def holds(self) -> list[dict[str, Any]]:
        return list((await self._call("GET", "/holds"))["holds"])

    async def held(self, hold_id: str) -> int:
        """How many requests ``hold_id`` keeps waiting now."""
        return next((h["waiting"] for h in await self.holds() if h["id"] == hold_id), 0)

    async def release(self, hold_id: str) -> dict[str, Any]:
        return await self._call("POST", f"/holds/{hold_id}:release")

    # ----------------------------------------------------------------- stats

    async def stats(self) -> dict[str, Any]:
        return await self._call("GET", "/stats")

    async def job_stats(self, job_name: str) -> dict[str, Any]:
        return (await self.stats())["jobs"].get(job_name, {})

    async def data_plane(self, job_name: str | None = None) -> dict[str, int]:
        """Data-plane requests served, by ``"<dialect>:<op>"`` (all jobs, or one job)."""
        stats = await self.stats()
        if job_name is None:
            return stats.get("dataPlane", {})
        return stats["jobs"].get(job_name, {}).get("dataPlane", {})

    async def reset_stats(self) -> dict[str, Any]:
        return await self._call("POST", "/stats:reset")

    # ------------------------------------------------------------------ jobs

    async def preempt(self, job: str, *, account: str | None = None) -> dict[str, Any]:
        return await self._call("POST", f"/rlorTrainerJobs/{job}:preempt", account=account)

    async def stop(
        self, job: str, state: str, message: str = "", *, account: str | None = None
    ) -> dict[str, Any]:
        return await self._call(
            "POST",
            f"/rlorTrainerJobs/{job}:stop",
            {"state": state, "message": message},
            account=account,
        )

    async def job(self, job: str, *, account: str | None = None) -> dict[str, Any]:
        """Internals: the trainer's pid and direct URL, the route, the generation."""
        return await self._call("GET", f"/rlorTrainerJobs/{job}", account=account)

    # -------------------------------------------------------------- accounts

    async def create_account(
        self, account_id: str | None = None, *, key_style: str = "tinker"
    ) -> tuple[str, str]:
        """A new account and its API key (``tinker``: ``tml-…``; ``fireworks``: ``fw_…``)."""
        body: dict[str, Any] = {"keyStyle": key_style}
        if account_id:
            body["accountId"] = account_id
        answer = await self._call("POST", "/accounts", body)
        return answer["account"]["name"].removeprefix("accounts/"), answer["apiKey"]

    async def create_api_key(self, account_id: str, *, key_style: str = "tinker") -> str:
        body = {"keyStyle": key_style}
        return (await self._call("POST", f"/accounts/{account_id}/apiKeys", body))["apiKey"]

    # -------------------------------------------------------------- webhooks

    async def add_webhook(self, url: str, secret: str, *, account_id: str | None = None) -> str:
        body = {"url": url, "secret": secret, "accountId": account_id}
        return (await self._call("POST", "/webhooks", body))["id"]

    async def webhooks(self) -> list[dict[str, Any]]:
        return (await self._call("GET", "/webhooks"))["webhooks"]

    async def delete_webhook(self, hook_id: str) -> None:
        await self._call("DELETE", f"/webhooks/{hook_id}")
