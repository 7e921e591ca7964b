"""The Temporal Web UI, in headless Chromium (Debian's): a job is findable by phase and label,
its page shows the static summary and the live current details, and pause/resume can be
sent from it as signals."""

from __future__ import annotations

import asyncio
import contextlib
import re
import shutil
from urllib.parse import quote

import pytest

from shepherd.jobs import start_job
from shepherd.phases import Phase
from tests.workflows.conftest import Stack
from tests.workflows.test_recovery import SLOW

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
playwright_api = pytest.importorskip(
    "playwright.async_api", reason="playwright is not installed (make test installs it)"
)

pytestmark = pytest.mark.skipif(
    CHROMIUM is None,
    reason="Chromium is not installed: `apt-get install chromium` (make test does it where it may) to run the Web UI test",
)

# As the machine notes advise: no background networking on a closed network.
ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


async def test_job_page_shows_details_and_takes_pause_and_resume(stack: Stack, ui_url: str) -> None:
    spec = stack.spec(
        "webui", labels={"team": "support"}, trainer=SLOW, training={"total_steps": 5000}
    )
    handle = await start_job(stack.client, spec, task_queue=stack.task_queue)
    stack.handles.append(handle)
    running = await stack.until(handle, lambda s: s.step >= 10 and s.phase is Phase.TRAINING)

    async with playwright_api.async_playwright() as pw:
        browser = await pw.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            page = await browser.new_page(viewport={"width": 1400, "height": 1600})
            # Findable by the search attributes, with the query users type in the UI.
            # (The job flips between TRAINING and CHECKPOINTING every few seconds: a query for
            # one phase would match only the loads that catch it, and on a busy machine a load
            # takes seconds.)
            query = (
                'ShepherdPhase IN ("TRAINING", "CHECKPOINTING") AND ShepherdLabels="team=support"'
            )
            # The list does not refresh by itself: load it again until visibility has the job.
            async with asyncio.timeout(90):
                while True:
                    await page.goto(f"{ui_url}/namespaces/default/workflows?query={quote(query)}")
                    with contextlib.suppress(playwright_api.Error):
                        await page.get_by_text(handle.id).first.wait_for(timeout=15_000)
                        break

            await page.goto(f"{ui_url}/namespaces/default/workflows/{handle.id}")
            # The tab can be clicked before the page is live; click until its panel shows.
            async with asyncio.timeout(30):
                while not await page.get_by_text("Current Details").first.is_visible():
                    await page.get_by_text("User Metadata").first.click()
                    await asyncio.sleep(0.5)
            # The UI renders the (markdown) summary and details in sandboxed frames.
            texts: list[str] = []
            async with asyncio.timeout(30):
                while not any("best checkpoint:" in t for t in texts):
                    texts = [await f.inner_text("body") for f in page.frames if not f.is_detached()]
                    await asyncio.sleep(0.3)
            shown = "\n".join(texts)
            assert f"trainer {running.trainer_job_id}" in shown  # current details
            # (The renderer typesets "70/200" with a fraction slash.)
            assert re.search(r"step \d+\D5000", shown) and "loss" in shown and "eval_loss" in shown
            assert "webui: 5000 steps" in shown  # the static summary

            async def send(signal: str) -> None:
                await page.get_by_role("button", name="More Actions").click()
                await page.get_by_role("menu").get_by_text("Send a Signal").click()
                await page.locator("[data-testid=signal-select-button]:visible").click()
                await (
                    page.locator("#signal-select-select:visible")
                    .get_by_text(signal, exact=True)
                    .click()
                )
                await page.get_by_role("textbox").last.fill("{}")
                await page.get_by_role("button", name="Submit").click()

            await send("pause")
            paused = await stack.until(handle, lambda s: s.phase is Phase.PAUSED)
            assert paused.paused_checkpoint is not None
            await page.reload()
            await send("resume")
            await stack.until(handle, lambda s: s.generation == 1 and s.phase is Phase.TRAINING)
        finally:
            await browser.close()
    await handle.cancel()
    async with asyncio.timeout(30):
        while (await stack.status(handle)).phase is not Phase.CANCELLED:
            await asyncio.sleep(0.2)
