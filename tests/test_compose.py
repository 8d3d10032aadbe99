"""docker-compose.yml cannot be run here (no Docker engine): check what can be checked without
one. Every reference resolves, the commands parse with the real CLI, the DSNs and URLs point at
services of the file with the credentials the database service sets, and nothing is published
beyond loopback. Also what ships beside the code: the license pyproject names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from synclane.cli import parser

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def services() -> dict[str, Any]:
    document = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    found: dict[str, Any] = document["services"]
    return found


def test_the_file_has_the_database_prefect_the_demo_and_its_deployments(
    services: dict[str, Any],
) -> None:
    assert set(services) == {"postgres", "prefect-server", "demo", "flows"}


def test_every_dependency_names_a_service_with_a_healthcheck(services: dict[str, Any]) -> None:
    for name, service in services.items():
        for needed, condition in (service.get("depends_on") or {}).items():
            assert needed in services, f"{name} depends on unknown {needed}"
            assert condition == {"condition": "service_healthy"}
            assert "healthcheck" in services[needed]


def test_the_image_copies_files_that_exist(services: dict[str, Any]) -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    for source in re.findall(r"^COPY (.+) \S+$", dockerfile, flags=re.M):
        for path in source.split():
            assert (ROOT / path).exists(), f"the Dockerfile copies missing {path}"
    assert all(services[name]["build"] == "." for name in ("demo", "flows"))


def test_the_demo_command_is_a_valid_synclane_command(services: dict[str, Any]) -> None:
    command = services["demo"]["command"]
    assert command[0] == "synclane"
    args = parser().parse_args(command[1:])
    assert args.command == "demo" and args.allow_remote and args.port == 8080
    assert services["demo"]["ports"] == ["127.0.0.1:8080:8080"], "publish on loopback only"


def test_the_flows_service_runs_the_deployable_project(services: dict[str, Any]) -> None:
    command = services["flows"]["command"]
    assert command[:1] == ["python"] and (ROOT / command[1]).is_file()


def test_dsns_and_urls_point_at_services_of_the_file(services: dict[str, Any]) -> None:
    database = services["postgres"]["environment"]
    for name in ("demo", "flows"):
        dsn = urlsplit(services[name]["environment"]["SYNCLANE_DSN"])
        assert dsn.hostname == "postgres" and dsn.port == 5432
        assert dsn.username == database["POSTGRES_USER"]
        assert dsn.password == database["POSTGRES_PASSWORD"]
        assert dsn.path == "/" + database["POSTGRES_DB"]
    api = urlsplit(services["flows"]["environment"]["PREFECT_API_URL"])
    assert api.hostname == "prefect-server" and api.port == 4200


def test_every_published_port_is_on_loopback_and_postgres_is_not_published(
    services: dict[str, Any],
) -> None:
    """A published 5432 clashes with a local PostgreSQL and offers the database (password
    `synclane`) to the network; Prefect's UI and the page are for this machine only."""
    assert "ports" not in services["postgres"]
    assert services["prefect-server"]["ports"] == ["127.0.0.1:4200:4200"]
    for name, service in services.items():
        for published in service.get("ports") or []:
            host, _, _ = str(published).partition(":")
            assert host == "127.0.0.1", f"{name} publishes {published} beyond loopback"


def test_the_license_pyproject_names_ships_with_the_code() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'license = "MIT"' in pyproject and 'license-files = ["LICENSE"]' in pyproject
    assert (ROOT / "LICENSE").read_text(encoding="utf-8").startswith("MIT License\n")
    assert "LICENSE" in (ROOT / "Dockerfile").read_text(encoding="utf-8")


def test_a_page_beyond_loopback_gets_its_login_secret(services: dict[str, Any]) -> None:
    """The demo's page listens on every interface inside its container: it then asks for a
    login secret (at least 16 characters, from the environment), and the file provides one."""
    demo = services["demo"]
    assert "--allow-remote" in demo["command"]
    secret = demo["environment"]["SYNCLANE_DASHBOARD_SECRET"]
    default = secret.split(":-", 1)[1].rstrip("}") if secret.startswith("${") else secret
    assert len(default) >= 16
