"""Shepherd's custom search attributes: registered when the server starts, set by the
workflows, queried by the CLI, the Python API and the Web UI
(``ShepherdPhase="TRAINING" AND ShepherdLabels="team=support"``)."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

PHASE = SearchAttributeKey.for_keyword("ShepherdPhase")
#: Labels as ``key=value`` keywords.
LABELS = SearchAttributeKey.for_keyword_list("ShepherdLabels")
TRAINER_JOB_ID = SearchAttributeKey.for_keyword("ShepherdTrainerJobId")
STEP = SearchAttributeKey.for_int("ShepherdStep")
MODEL = SearchAttributeKey.for_keyword("ShepherdModel")
JOB_NAME = SearchAttributeKey.for_keyword("ShepherdJobName")
SWEEP = SearchAttributeKey.for_keyword("ShepherdSweep")
SCHEDULE = SearchAttributeKey.for_keyword("ShepherdSchedule")
PARENT = SearchAttributeKey.for_keyword("ShepherdParent")
#: The output model id a live job (or a sweep's promote_best) claims from submission on, so
#: that no second live job can claim it (shepherd.preflight).
OUTPUT_MODEL = SearchAttributeKey.for_keyword("ShepherdOutputModel")

ALL: tuple[SearchAttributeKey, ...] = (
    PHASE,
    LABELS,
    TRAINER_JOB_ID,
    STEP,
    MODEL,
    JOB_NAME,
    SWEEP,
    SCHEDULE,
    PARENT,
    OUTPUT_MODEL,
)

#: Set by Temporal on runs started by a schedule (built in; not registered by us).
SCHEDULED_START = SearchAttributeKey.for_datetime("TemporalScheduledStartTime")

_CLI_TYPES = {"KEYWORD": "Keyword", "KEYWORD_LIST": "KeywordList", "INT": "Int"}


def cli_type(key: SearchAttributeKey) -> str:
    return _CLI_TYPES[key.indexed_value_type.name.removeprefix("INDEXED_VALUE_TYPE_")]


def server_flags() -> list[str]:
    """``--search-attribute Name=Type`` flags for ``temporal server start-dev``."""
    flags = []
    for key in ALL:
        flags += ["--search-attribute", f"{key.name}={cli_type(key)}"]
    return flags
