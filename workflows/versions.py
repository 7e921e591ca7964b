"""Which lifecycle a job's run follows: decided once, in the run's first workflow task.

A run started by this code records the ``REPLAY_SAFE`` patch marker in its first workflow task
(whose jobs are the same live and on replay, so the decision is too) and follows the current
lifecycle:

- **no local activities.** temporalio 1.35.0 (its Core) can deliver a local activity's result
  one workflow task later than replay does: when the worker answers a query while the task
  that ran the local activity is in flight, Core completes that task with the activity's
  marker, forces a new task, and hands the result to the workflow only there; replaying, it
  hands the result over in the task that holds the marker. Whatever the workflow does next
  then runs in another task live than on replay: the first ``workflow.patched()`` of a patch
  returns False where its marker is not yet in sight, and a signal that arrived meanwhile is
  seen before the result live but after it on replay. The reproduction, and what the history
  shows, are in ``docs/determinism.md``. Without local activities every result arrives in the
  task that history says, live and on replay alike;
- **every patch below taken as applied**, without markers of its own;
- a cancel request is checked before every command the lifecycle sends (``job.py``,
  ``_stop_if_cancelled``).

Runs recorded before it (no marker in their first task) replay through the legacy branch: each
patch below decided where it always was, local activities where they ran.
"""

from __future__ import annotations

from temporalio import workflow

#: The marker of the current lifecycle (see the module docstring).
REPLAY_SAFE = "replay-safe-lifecycle"

#: The lifecycle's patches before ``REPLAY_SAFE``, oldest first. Current runs take them all as
#: applied; legacy runs decide each where its call always was.
LEGACY_PATCHES = (
    "chunk-stops-on-death-event",
    "trainer-id-names-its-workflow",
    "polls-on-the-waits-queue",
    "open-model-before-warm-up",
    "check-checkpoint-before-provisioning",
    "check-resume-checkpoint",
    "check-model-before-provisioning",
    "chunk-reports-its-own-death",
    "refused-trainer-fails-at-once",
    "claim-templated-model-id",
    "phase-stays-recovering",
    "create-trainer-local",
)
#: A legacy run that recorded this patch was written by code that had every patch above, so
#: the first call of each recorded its marker somewhere in the run's history.
LAST_LEGACY = LEGACY_PATCHES[-1]

# Changes made with or after the current lifecycle: on in every current run (no marker); a
# legacy run decides each where it first meets it (on live, recorded before on replay).

#: A cancel request is checked before every command the lifecycle sends.
CANCEL_CHECKED = "cancel-checked-before-commands"
#: A local activity's failure (temporalio 1.35 raises it unwrapped, not as an ActivityError)
#: is handled like any activity failure: the job finishes FAILED with its cleanup.
LOCAL_FAILURES_HANDLED = "local-activity-failures-are-handled"
#: A platform restart counts as one (status.platform_restarts), not as a preemption.
RESTARTS_APART = "platform-restarts-are-not-preemptions"
#: The job's first activity checks what only a worker can (activities/preflight.py).
PREFLIGHT = "preflight-before-provisioning"
#: A job hot-loads its checkpoint onto ``output.hot_load_deployment`` at the end.
PUBLISHES = "publishes-to-deployment"
#: All of them.
ADOPTED = (CANCEL_CHECKED, LOCAL_FAILURES_HANDLED, RESTARTS_APART, PREFLIGHT, PUBLISHES)


def marker_in_sight(patch_id: str) -> bool:
    """Whether a replaying workflow has been told of ``patch_id``'s marker: the SDK notifies it
    of the markers in the workflow task being replayed, before that task's jobs. Read from the
    SDK's own record (no public API says it); if that record is ever gone, True, which is the
    behaviour without this check."""
    runtime = workflow._Runtime.current()  # noqa: SLF001 - see the docstring
    notified = getattr(runtime, "_patches_notified", None)
    return notified is None or patch_id in notified
