"""The Python API's errors: a bad argument is a SpecError naming it and its rule, raised
before anything is sent; Temporal out of reach is TemporalUnreachable with the address, in
words (never the SDK's Rust transport error). A workflow that is not there is JobNotFound
(tests/workflows/test_submission_guards.py, against a real server)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.service import RetryConfig

import shepherd
from shepherd.client import Shepherd, TemporalUnreachable, transport_reason
from shepherd.spec import SpecError
from tests.helpers import spec_data

#: Nothing listens here.
NOWHERE = "127.0.0.1:1"


def _spec() -> dict[str, Any]:
    return spec_data("ok")


def _sweep() -> dict[str, Any]:
    return {
        "name": "sw",
        "spec": _spec(),
        "parameters": {"trainer.lora_rank": {"type": "int", "min": 4, "max": 8, "step": 4}},
        "metric": "eval_loss",
    }


Call = Callable[[Shepherd], Awaitable[Any]]


async def _lazy_client() -> Client:
    """A client of NOWHERE that connects at its first call, and fails fast."""
    return await Client.connect(
        NOWHERE, lazy=True, retry_config=RetryConfig(max_retries=1, max_elapsed_time_millis=500)
    )


@pytest.mark.parametrize(
    ("call", "field", "rule"),
    [
        (lambda sh: sh.submit(_spec(), task_queue=""), "task_queue", "task queue name"),
        (lambda sh: sh.submit(_spec(), task_queue="two words"), "task_queue", "1-200"),
        (lambda sh: sh.submit(_spec(), task_queue=7), "task_queue", "task queue name"),
        (lambda sh: sh.plan(_spec(), task_queue=""), "task_queue", "task queue name"),
        (lambda sh: sh.submit_sweep(_sweep(), task_queue=""), "task_queue", "task queue name"),
        (lambda sh: sh.submit(_spec(), rerun="yes"), "rerun", "True or False"),
        (lambda sh: sh.submit(_spec(), parent_workflow_id=""), "parent_workflow_id", ""),
        (
            lambda sh: sh.submit(_spec(), parent_workflow_id=5),
            "parent_workflow_id",
            "existing job",
        ),
        (lambda sh: sh.list(limit=-1), "limit", "at least 1"),
        (lambda sh: sh.list(limit=0), "limit", "at least 1"),
        (lambda sh: sh.list(limit=True), "limit", "whole number"),
        (lambda sh: sh.list(limit=2.5), "limit", "whole number"),
        (lambda sh: sh.list(query=3), "query", "string"),
        (lambda sh: anext(sh.get("job-x").watch(interval=0)), "interval", "positive"),
        (lambda sh: anext(sh.get("job-x").watch(interval=float("inf"))), "interval", "finite"),
    ],
)
async def test_a_bad_argument_is_refused_by_name_before_anything_is_sent(
    call: Call, field: str, rule: str
) -> None:
    # Nothing listens there: a call that reached the server would fail otherwise.
    sh = Shepherd(await _lazy_client(), task_queue="unused")
    with pytest.raises(SpecError) as refused:
        await call(sh)
    (problem,) = refused.value.problems
    assert problem.field == field and rule in problem.rule, problem


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"task_queue": ""}, "task_queue"),
        ({"address": ""}, "address"),
        ({"address": "localhost"}, "address"),  # no port: it would dial port 80
        ({"address": "host:port"}, "address"),
        ({"namespace": ""}, "namespace"),
        ({"namespace": "two words"}, "namespace"),
    ],
)
async def test_connect_refuses_bad_settings_before_connecting(
    kwargs: dict[str, Any], field: str
) -> None:
    with pytest.raises(SpecError) as refused:
        await Shepherd.connect(**kwargs)
    assert refused.value.problems[0].field == field


async def test_an_unreachable_server_is_named_with_its_address_in_words() -> None:
    with pytest.raises(TemporalUnreachable) as unreachable:
        await Shepherd.connect(NOWHERE)
    message = str(unreachable.value)
    assert unreachable.value.address == NOWHERE and NOWHERE in message
    assert "Connection refused" in message and "tonic" not in message
    assert isinstance(unreachable.value, ConnectionError)  # what callers may already catch


async def test_calls_of_a_lazy_client_with_no_server_are_unreachable_too() -> None:
    """A lazy client connects at its first call (the SDK then raises a RuntimeError); a
    server gone after connecting: tests/workflows/test_submission_guards.py."""
    sh = Shepherd(await _lazy_client(), task_queue="q")
    calls: list[Call] = [
        lambda sh: sh.get("job-x").status(),
        lambda sh: sh.get("job-x").cancel(),
        lambda sh: sh.list(),
        lambda sh: anext(sh.get("job-x").watch()),
        lambda sh: sh.get_sweep("sweep-x").status(),
    ]
    for call in calls:
        with pytest.raises(TemporalUnreachable) as unreachable:
            await call(sh)
        assert NOWHERE in str(unreachable.value) and "tonic" not in str(unreachable.value)


def test_transport_errors_read_as_words() -> None:
    refused = (
        "Failed client connect: Server connection error: tonic::transport::Error(Transport, "
        'ConnectError(ConnectError("tcp connect error", 127.0.0.1:1, Os { code: 111, kind: '
        'ConnectionRefused, message: "Connection refused" })))'
    )
    assert transport_reason(refused) == "tcp connect error: Connection refused"
    dns = (
        "Failed client connect: Server connection error: tonic::transport::Error(Transport, "
        'ConnectError(ConnectError("dns error", Custom { kind: Uncategorized, error: '
        '"failed to lookup address information: Name or service not known" })))'
    )
    assert transport_reason(dns) == (
        "dns error: failed to lookup address information: Name or service not known"
    )
    assert "tonic" not in transport_reason("Server connection error: tonic::transport::Error(X)")


def test_the_errors_are_exported() -> None:
    assert shepherd.JobNotFound.__name__ == "JobNotFound"
    assert shepherd.TemporalUnreachable is TemporalUnreachable
