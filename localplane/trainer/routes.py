"""Every endpoint a trainer serves, declared in one table: (method, path) -> handler.

Paths are relative to ``{base}/api/v1/`` (trainer-api.md §4, §7). A path that matches no
pattern is an *unknown endpoint*: 400 with status ``UNIMPLEMENTED`` and the list of what is
served — never a 404, which a client cannot tell from the gateway's route race (§5), and never
a 5xx, which the SDKs retry for minutes. A known path with the wrong method is 405 with an
``Allow`` header; nothing is executed (a ``DELETE …/optim_step`` applies no step).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from localplane.errors import MethodNotAllowed, UnknownEndpoint, shorten
from localplane.trainer.training import SEQUENCED
from shepherd.tinker_wire import paths

if TYPE_CHECKING:
    from localplane.trainer.service import TrainerService


@dataclass
class Call:
    """One request as a handler sees it."""

    svc: TrainerService
    body: dict[str, Any]
    params: dict[str, str]
    query: dict[str, str]


Handler = Callable[[Call], Any]  # a result dict, or an awaitable of one


Route = paths.Route[Handler]


def _unsupported(why: str) -> Handler:
    """A Tinker endpoint this trainer knows and refuses, saying why (a 400, not retried)."""

    def refuse(call: Call) -> dict[str, Any]:
        raise UnknownEndpoint(why)

    return refuse


def _sequenced(op: str) -> Handler:
    return lambda c: c.svc.models.submit(op, c.body)


ROUTES: list[Route] = [
    # -- client plumbing
    Route("POST", "client/config", "client/config", lambda c: c.svc.client_config(c.body)),
    Route("POST", "client/dynamic_config", "client/dynamic_config", lambda c: {}),
    Route("POST", "telemetry", "telemetry", lambda c: {"status": "accepted"}),
    Route("GET", "healthz", "healthz", lambda c: {"status": "ok", "tables": c.svc.stats()}),
    Route(
        "GET",
        "get_server_capabilities",
        "get_server_capabilities",
        lambda c: c.svc.server_capabilities(),
    ),
    # -- sessions
    Route("POST", "create_session", "create_session", lambda c: c.svc.create_session(c.body)),
    Route(
        "POST", "session_heartbeat", "session_heartbeat", lambda c: c.svc.session_heartbeat(c.body)
    ),
    Route(
        "POST",
        "sessions/{session_id}/finish",
        "session_finish",
        lambda c: c.svc.finish_session(c.params["session_id"]),
    ),
    Route("GET", "sessions", "list_sessions", lambda c: c.svc.list_sessions(c.query)),
    Route(
        "GET",
        "sessions/{session_id}",
        "get_session",
        lambda c: c.svc.get_session(c.params["session_id"]),
    ),
    # -- models and training
    Route("POST", "create_model", "create_model", lambda c: c.svc.models.create_model(c.body)),
    Route("POST", "get_info", "get_info", lambda c: c.svc.models.get_info(c.body)),
    Route("POST", "unload_model", "unload_model", lambda c: c.svc.models.unload(c.body)),
    *(Route("POST", op, op, _sequenced(op)) for op in sorted(SEQUENCED)),
    # -- sampling
    Route(
        "POST",
        "create_sampling_session",
        "create_sampling_session",
        lambda c: c.svc.samplers.create_sampling_session(c.body),
    ),
    Route("POST", "asample", "asample", lambda c: c.svc.samplers.asample(c.body)),
    Route(
        "GET",
        "samplers/{sampler_id}",
        "get_sampler",
        lambda c: c.svc.get_sampler(c.params["sampler_id"]),
    ),
    # -- futures (served by the HTTP layer: its answer is encoded as the future's own op)
    Route("POST", "retrieve_future", "retrieve_future", lambda c: c.svc.retrieve(c.body)),
    # -- checkpoints and training runs
    Route("POST", "weights_info", "weights_info", lambda c: c.svc.weights_info(c.body)),
    Route("GET", "list_checkpoints", "list_checkpoints", lambda c: c.svc.list_checkpoints()),
    Route("POST", "list_checkpoints", "list_checkpoints", lambda c: c.svc.list_checkpoints()),
    Route("GET", "training_runs", "list_training_runs", lambda c: c.svc.training_runs(c.query)),
    Route(
        "GET",
        "training_runs/{run_id}",
        "get_training_run",
        lambda c: c.svc.training_run(c.params["run_id"]),
    ),
    Route(
        "GET",
        "training_runs/{run_id}/checkpoints",
        "list_run_checkpoints",
        lambda c: c.svc.run_checkpoints(c.params["run_id"]),
    ),
    Route("GET", "checkpoints", "list_user_checkpoints", lambda c: c.svc.user_checkpoints(c.query)),
    Route(
        "PUT",
        "training_runs/{run_id}/checkpoints/{checkpoint_id:path}/ttl",
        "set_checkpoint_ttl",
        lambda c: c.svc.set_checkpoint_ttl(c.params["run_id"], c.params["checkpoint_id"], c.body),
    ),
    *(
        Route(
            method,
            "training_runs/{run_id}/checkpoints/{checkpoint_id:path}/publish",
            "publish_checkpoint",
            _unsupported(
                "publishing checkpoints (making them public) is not supported by localplane"
            ),
        )
        for method in ("POST", "DELETE")
    ),
    Route(
        "DELETE",
        "training_runs/{run_id}/checkpoints/{checkpoint_id:path}",
        "delete_checkpoint",
        lambda c: c.svc.delete_checkpoint(c.params["run_id"], c.params["checkpoint_id"]),
    ),
    # -- known Tinker endpoints this trainer refuses, with the reason
    Route(
        "POST",
        "create_custom_loss",
        "create_custom_loss",
        _unsupported(
            "server-side custom losses are not supported; forward_backward_custom runs the loss "
            "client-side (the default client config)"
        ),
    ),
    Route(
        "POST",
        "copy_weights",
        "copy_weights",
        _unsupported("copying checkpoints between projects is not supported"),
    ),
    Route(
        "POST",
        "save_weights_external",
        "save_weights_external",
        _unsupported("external weights exports are not supported; use save_weights_for_sampler"),
    ),
]

TABLE = paths.RouteTable(ROUTES)


def served() -> str:
    return TABLE.served


def match(method: str, path: str) -> tuple[Route, dict[str, str]]:
    """The route of ``method path`` (``path`` relative to ``api/v1/``) and its parameters."""
    found = TABLE.find(method, path)
    if isinstance(found, tuple):
        return found
    if found:
        raise MethodNotAllowed(
            f"method {method} is not allowed on api/v1/{shorten(path)}; allowed: "
            + ", ".join(found)
        )
    raise UnknownEndpoint(
        f"no such endpoint: {method} api/v1/{shorten(path)} (this trainer serves: {served()})"
    )


def allowed(path: str) -> list[str]:
    return TABLE.allowed(path)
