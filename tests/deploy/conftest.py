"""Fixtures for the deployment files: rendered charts and the resolved compose model."""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.script import validate_deploy


@pytest.fixture(scope="session")
def default_manifests() -> list[dict[str, Any]]:
    return validate_deploy.render_chart()


@pytest.fixture(scope="session")
def production_manifests() -> list[dict[str, Any]]:
    return validate_deploy.render_chart(validate_deploy.production_values())


@pytest.fixture(scope="session")
def compose() -> dict[str, Any]:
    return validate_deploy.compose_config()
