"""The API's process state: one `AppState`, set by `create_app`, read through `state_of`."""

from __future__ import annotations

import dataclasses

import httpx
import pytest
from starlette.applications import Starlette

from jobqueue_api.app import shut_down
from jobqueue_api.state import AppState, state_of
from tests.api.conftest import app_of


async def test_the_app_holds_one_frozen_state_set_at_creation(api: httpx.AsyncClient):
    state = state_of(app_of(api))
    assert isinstance(state, AppState)
    with pytest.raises(dataclasses.FrozenInstanceError):
        state.engine = None  # type: ignore[misc]
    assert state.admission is None and state.tracer is None  # neither configured here
    assert state.openapi["openapi"] == "3.1.0"


async def test_shutting_down_is_the_one_thing_that_changes(api: httpx.AsyncClient):
    assert (await api.get("/readyz")).status_code == 200
    shut_down(app_of(api))
    assert state_of(app_of(api)).shutting_down.is_set()
    assert (await api.get("/readyz")).status_code == 503


def test_an_app_not_made_by_create_app_has_no_state():
    with pytest.raises(TypeError, match="create_app"):
        state_of(Starlette())
