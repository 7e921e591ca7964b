"""The one place Temporal clients are created (with the pydantic data converter), and the
connection settings shared by workers, the CLI and the Python API."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict
from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client, TLSConfig
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.runtime import Runtime
from temporalio.service import RetryConfig

from shepherd import search_attributes

DEFAULT_TASK_QUEUE = "shepherd"

#: How a worker's calls to the server are retried: what it must not lose — an activity's
#: completion, a heartbeat, a signal from an activity — is retried through a server restart
#: or an outage of minutes, not the SDK's default 10 s (after which a finished activity's
#: result was dropped and its job sat until the activity's start-to-close timeout). A call is
#: tried at most ``max_interval`` (2 s) after the server is back: the issue 32 budget is an
#: outage's length plus 10 s; the SDK's own task pollers back off on a schedule of their own
#: (not configurable from Python), which is most of the rest (6.5 s was the worst measured
#: stall after the server's return, bench/outage.py). Past
#: ``max_elapsed`` (10 min) the activities' own timeouts take over (the server's timers fire
#: on its return and retry the activity). Declared here, where clients are made; listed in
#: workflows/policies.py.
SERVER_CALL_RETRY = RetryConfig(
    initial_interval_millis=200,
    randomization_factor=0.2,
    multiplier=2.0,
    max_interval_millis=2_000,
    max_elapsed_time_millis=10 * 60 * 1000,
    # (10 min at most every 2 s after a short ramp: ~300 tries; never the limit.)
    max_retries=1_000,
)


class TemporalSettings(BaseSettings):
    """``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``, ``TEMPORAL_TLS_*``
    and ``SHEPHERD_TASK_QUEUE``."""

    model_config = SettingsConfigDict(extra="ignore", populate_by_name=True)

    address: str = Field(default="localhost:7233", validation_alias="TEMPORAL_ADDRESS")
    namespace: str = Field(default="default", validation_alias="TEMPORAL_NAMESPACE")
    task_queue: str = Field(default=DEFAULT_TASK_QUEUE, validation_alias="SHEPHERD_TASK_QUEUE")
    api_key: SecretStr | None = Field(default=None, validation_alias="TEMPORAL_API_KEY")
    tls: bool = Field(default=False, validation_alias="TEMPORAL_TLS")
    tls_cert: Path | None = Field(default=None, validation_alias="TEMPORAL_TLS_CERT")
    tls_key: Path | None = Field(default=None, validation_alias="TEMPORAL_TLS_KEY")
    tls_ca: Path | None = Field(default=None, validation_alias="TEMPORAL_TLS_CA")

    def tls_config(self) -> TLSConfig | bool:
        if self.tls_cert or self.tls_key or self.tls_ca:
            return TLSConfig(
                client_cert=self.tls_cert.read_bytes() if self.tls_cert else None,
                client_private_key=self.tls_key.read_bytes() if self.tls_key else None,
                server_root_ca_cert=self.tls_ca.read_bytes() if self.tls_ca else None,
            )
        return self.tls or self.api_key is not None


async def connect(
    settings: TemporalSettings | None = None,
    *,
    runtime: Runtime | None = None,
    retry: RetryConfig | None = None,
) -> Client:
    """A client; ``retry``: how its calls are retried (a worker's: :data:`SERVER_CALL_RETRY`;
    the CLI's keep the SDK's short default, so a user is told at once that the server is
    not there)."""
    settings = settings or TemporalSettings()
    return await Client.connect(
        settings.address,
        namespace=settings.namespace,
        data_converter=pydantic_data_converter,
        tls=settings.tls_config(),
        api_key=settings.api_key.get_secret_value() if settings.api_key else None,
        runtime=runtime,
        retry_config=retry,
    )


async def ensure_search_attributes(client: Client) -> list[str]:
    """Register Shepherd's search attributes that the namespace lacks; returns the added.

    ``temporal server start-dev --search-attribute`` only registers them on a new database,
    so an upgraded state directory needs this too."""
    existing = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    missing = {
        key.name: IndexedValueType.ValueType(key.indexed_value_type)
        for key in search_attributes.ALL
        if key.name not in existing.custom_attributes
    }
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
        )
    return sorted(missing)
