"""The workflow's versions: the baseline, and the changes made since that running jobs must
survive (docs/upgrades.md says how a change reaches jobs that run for days, and how the suite
proves it).

**The 0.x baseline** is the lifecycle that ran from the ``REPLAY_SAFE`` marker on: no local
activities (temporalio 1.35 can deliver a local activity's result one workflow task later live
than on replay — docs/determinism.md), a cancel request checked before every command. Runs
recorded before it are gone with the code that wrote them (Shepherd was never released); the
baseline's own recorded histories (tests/histories) carry the marker, which current code
deprecates: a history with or without it replays.

**Patches since the baseline**: :data:`PATCHES`. A change that running jobs could not replay
is made with ``workflow.patched(ID)`` where it differs, ``ID`` added to :data:`PATCHES` with
the date it may be retired, then ``workflow.deprecate_patch(ID)`` once no job started before
it runs, then removed (docs/upgrades.md).
"""

from __future__ import annotations

#: The baseline lifecycle's marker (deprecated: recorded by runs of the baseline's first days).
REPLAY_SAFE = "replay-safe-lifecycle"

#: A checkpoint whose metric ties the best's becomes the best (the later one): jobs before
#: it kept the first of equals, and pruned differently.
TIES_GO_TO_THE_LATER = "ties-go-to-the-later"

#: A finishing job gives its slot back as its trainer's delete is sent, not after it: the next
#: job's admission overlaps the delete. Jobs before it released after.
SLOT_BACK_WITH_THE_TRAINER = "slot-back-with-the-trainer"

#: A trainer lost by the proxy's (or a call's) word alone is classified by what the platform
#: then says of it (a platform restart is one, for program jobs too): jobs before it counted
#: such a loss as a failure at once.
ASK_THE_PLATFORM_WHY = "ask-the-platform-why"

#: A program job's step is in the job list (its search attribute), set at each progress report
#: that moves it: jobs before it showed no step there.
PROGRAM_STEP_LISTED = "program-step-listed"

#: A trainer's work gets ready (the model opened, the route warmed up) from its placement on,
#: beside the wait for RUNNING: jobs before it started only once RUNNING was seen.
PREPARE_WHILE_BOOTING = "prepare-while-booting"

#: The scheduler tells jobs of their grants (and asks them to make way) through an activity
#: that signals them by RPC, not by the workflow's own signals, which the server delivers
#: from its transfer queue (minutes late behind a burst of starts).
TELL_JOBS_BY_ACTIVITY = "tell-jobs-by-activity"

#: The scheduler tells the waiting jobs their places (a new timer and activity in its loop),
#: which their Web UI page shows.
TELL_PLACES = "tell-places"

#: The waiting jobs beyond the first of a line are told ranges by powers of ten (11-100,
#: 101-1,000, ...), not the finer ranges before (51-100, 101-200, 201-500, ...): fewer notices.
COARSE_PLACES = "coarse-places"

#: A job's preflight also sends its first ask for a slot (where the backend has a scheduler):
#: jobs before it asked in an activity of its own, after the preflight.
ASK_WITH_PREFLIGHT = "ask-with-preflight"

#: Patches since the baseline, oldest first: (id, what changed, when it may be deprecated).
PATCHES: tuple[tuple[str, str, str], ...] = (
    (
        TIES_GO_TO_THE_LATER,
        "a checkpoint that ties the best by checkpoint.metric becomes the best",
        # Released 2026-11-28, plus the longest job lifetime (30 days).
        "2026-12-28",
    ),
    (
        SLOT_BACK_WITH_THE_TRAINER,
        "a finishing job's delete and slot release are sent together",
        "2026-12-28",
    ),
    (
        ASK_THE_PLATFORM_WHY,
        "a loss without the platform's word waits for it before it is classified",
        "2026-12-28",
    ),
    (
        PROGRAM_STEP_LISTED,
        "a program job's progress report sets its step in the job list",
        "2026-12-28",
    ),
    (
        PREPARE_WHILE_BOOTING,
        "a trainer's work gets ready from its placement on, beside the wait for RUNNING",
        # Released 2026-11-28, plus the longest job lifetime (30 days).
        "2026-12-29",
    ),
    (
        TELL_JOBS_BY_ACTIVITY,
        "the scheduler's grants and make-way notices are sent by an activity",
        # Released 2026-11-29, plus the longest job lifetime (30 days).
        "2026-12-30",
    ),
    (
        TELL_PLACES,
        "the scheduler tells the waiting jobs their places (or ranges)",
        # Released 2026-11-29, plus the longest job lifetime (30 days).
        "2026-12-30",
    ),
    (
        COARSE_PLACES,
        "the scheduler tells the waiting jobs ranges by powers of ten",
        # Released 2026-11-29, plus the longest job lifetime (30 days).
        "2026-12-30",
    ),
    (
        ASK_WITH_PREFLIGHT,
        "a job's preflight sends its first ask for a slot",
        "2026-12-30",
    ),
)
