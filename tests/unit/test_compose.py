"""docker-compose.yml's structure, checked without a Docker engine: the services a
production-shaped stack needs, pinned images, how they reach each other, and the search
attributes the admin tools register — compared with the code's own list."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from shepherd import search_attributes as sa

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
SERVICES: dict[str, Any] = COMPOSE["services"]


def test_services_and_pinned_images() -> None:
    assert set(SERVICES) == {
        "postgresql",
        "temporal",
        "temporal-admin-tools",
        "temporal-ui",
        "localplane",
        "shepherd-worker",
        "prometheus",
    }
    for name, service in SERVICES.items():
        if "image" in service:
            image = service["image"]
            assert ":" in image and not image.endswith(":latest"), (
                f"{name}: pin the image ({image})"
            )
        else:
            assert service["build"] == ".", name
    assert (ROOT / "Dockerfile").is_file()


def test_temporal_runs_on_postgresql() -> None:
    temporal = SERVICES["temporal"]
    assert temporal["environment"]["DB"] == "postgres12"
    assert temporal["environment"]["POSTGRES_SEEDS"] == "postgresql"
    assert temporal["depends_on"]["postgresql"]["condition"] == "service_healthy"
    assert "7233:7233" in temporal["ports"]
    assert "healthcheck" in SERVICES["postgresql"] and "healthcheck" in temporal


def test_ui_and_workers_reach_temporal_and_the_plane() -> None:
    ui = SERVICES["temporal-ui"]
    assert ui["environment"]["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert any(p.startswith("8233:") for p in ui["ports"])
    worker = SERVICES["shepherd-worker"]
    env = worker["environment"]
    assert env["TEMPORAL_ADDRESS"] == "temporal:7233"
    assert env["SHEPHERD_BACKEND_LOCAL_URL"] == "http://localplane:8300"
    # A key is named by the profile and comes from the environment, never a literal here.
    assert env["SHEPHERD_BACKEND_LOCAL_API_KEY_ENV"] == "SHEPHERD_PLANE_API_KEY"
    assert env["FIREWORKS_API_KEY"].startswith("${")
    assert worker["command"] == ["worker"] and worker["deploy"]["replicas"] >= 1
    assert (
        worker["depends_on"]["temporal-admin-tools"]["condition"]
        == "service_completed_successfully"
    )
    plane = SERVICES["localplane"]
    assert plane["command"][0] == "plane" and "8300:8300" in plane["ports"]
    assert any(v.endswith(":/data") for v in plane["volumes"])


def test_admin_tools_register_every_search_attribute() -> None:
    script = " ".join(SERVICES["temporal-admin-tools"]["command"])
    registered = dict(re.findall(r"(Shepherd\w+)=(\w+)", script))
    assert registered == {key.name: sa.cli_type(key) for key in sa.ALL}


def test_prometheus_scrapes_every_worker_at_the_ports_they_serve() -> None:
    """Both of a worker's endpoints (workers/metrics.py), on every replica (DNS), admission
    declared for the local plane."""
    env = SERVICES["shepherd-worker"]["environment"]
    ports = {
        int(env[k].rsplit(":", 1)[1]) for k in ("SHEPHERD_METRICS", "SHEPHERD_TEMPORAL_METRICS")
    }
    prometheus = SERVICES["prometheus"]
    mount = next(
        v for v in prometheus["volumes"] if v.endswith(":/etc/prometheus/prometheus.yml:ro")
    )
    config = yaml.safe_load((ROOT / mount.split(":")[0]).read_text())
    scraped = {
        (name, sd["port"])
        for job in config["scrape_configs"]
        for sd in job["dns_sd_configs"]
        for name in sd["names"]
    }
    assert scraped == {("shepherd-worker", port) for port in ports}
    assert env["SHEPHERD_BACKEND_LOCAL_SLOTS"].startswith("${")
