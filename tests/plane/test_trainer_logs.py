"""The trainer log extension (trainer-api.md §7): ``GET …/rlorTrainerJobs/{j}:logs`` pages
through every run of a job from a position, stamps each line, keeps the plane's own lines
and every key out, outlives the job's deletion, and answers only the job's own account."""

from __future__ import annotations

import asyncio
import base64
import json
from datetime import datetime

import httpx
import pytest

from localplane.admin import PlaneAdmin
from localplane.process import PlaneProcess
from shepherd.platform import InvalidArgument, NotFound
from shepherd.platform.models import TrainerLogEntry, TrainerLogPage
from shepherd.states import JobState
from tests.helpers import Account, job_request, running_trainer, wait_state


async def read_all(
    account: Account, job_id: str, token: str | None = None, page_size: int | None = None
) -> tuple[list[TrainerLogEntry], str]:
    """Every line after ``token``, page by page; and where to continue."""
    entries: list[TrainerLogEntry] = []
    while True:
        page: TrainerLogPage = await account.client.read_log(
            job_id, page_token=token, page_size=page_size
        )
        entries += page.log_entries
        token = page.next_page_token
        if page.caught_up:
            return entries, token


def _token(position: dict[str, object]) -> str:
    return base64.urlsafe_b64encode(json.dumps(position).encode()).decode()


def events(entries: list[TrainerLogEntry]) -> list[str]:
    return [json.loads(e.text)["event"] for e in entries]


async def test_log_pages_from_a_position_across_runs_and_after_delete(
    account: Account, admin: PlaneAdmin, plane: PlaneProcess
) -> None:
    trainer = await running_trainer(account, "logged")
    first, token = await read_all(account, "logged")
    assert events(first)[:3] == ["trainer.ready", "session.created", "model.created"]
    assert {e.run for e in first} == {1}
    times = [e.time for e in first]
    assert all(isinstance(t, datetime) for t in times) and times == sorted(times)  # stamped
    assert not any("LOCALPLANE_TRAINER_READY" in e.text for e in first)  # the plane's handshake

    # One line a page gives the same lines; the last token then has nothing new.
    paged, paged_token = await read_all(account, "logged", page_size=1)
    assert paged == first and paged_token == token
    assert (await account.client.read_log("logged", page_token=token)).log_entries == []

    # New output: read from the token, only it comes.
    await trainer.api.session()
    after, token = await read_all(account, "logged", token)
    assert events(after) == ["session.created"]

    # A resumed job writes a second run, read on from the same token.
    await admin.stop("logged", JobState.CANCELLED.value, "console cancel", account=account.id)
    await wait_state(account.client, "logged", JobState.CANCELLED)
    await account.client.resume_job("logged")
    resumed: list[TrainerLogEntry] = []
    async with asyncio.timeout(30):
        while not resumed:  # as a follower does: ask again from the same position
            resumed, token = await read_all(account, "logged", token)
            await asyncio.sleep(0.05)
    assert events(resumed)[0] == "trainer.ready" and {e.run for e in resumed} == {2}

    # Deleted: the whole log is still there, and no key is in it.
    await account.client.delete_job("logged")
    await wait_state(account.client, "logged", JobState.DELETED)
    whole, _ = await read_all(account, "logged")
    assert whole[: len(first) + 1] == first + after
    assert [e for e in whole if e.run == 2][: len(resumed)] == resumed
    text = "\n".join(e.text for e in whole)
    assert account.api_key not in text and plane.admin_key not in text


async def test_log_access_follows_the_account_rules(
    account: Account, admin: PlaneAdmin, plane: PlaneProcess, http: httpx.AsyncClient
) -> None:
    await account.client.create_job("private", job_request())
    path = f"/v1/accounts/{account.id}/rlorTrainerJobs/private:logs"
    _, other_key = await admin.create_account()
    for key, code in ((other_key, 403), (plane.admin_key, 403), ("lp_no-such-key", 401)):
        answer = await http.get(path, headers={"Authorization": f"Bearer {key}"})
        assert answer.status_code == code, answer.text
    ok = await http.get(path, headers={"X-Api-Key": account.api_key})
    assert ok.status_code == 200 and set(ok.json()) == {"logEntries", "nextPageToken", "caughtUp"}

    with pytest.raises(NotFound) as missing:
        await account.client.read_log("never-was")
    assert "never-was" in missing.value.message
    for token in ("not-a-token", _token({"r": True, "o": 0}), _token({"r": 1, "o": 2**63})):
        with pytest.raises(InvalidArgument) as bad:
            await account.client.read_log("private", page_token=token)
        assert "pageToken" in bad.value.message
    await account.client.delete_job("private")
