"""docs/api.md's example job record has the fields, in their order, of what the API answers."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest

from tests.e2e.test_api_process import Api
from tests.worker.support import ROOT

pytestmark = pytest.mark.e2e


def test_the_documented_record_is_what_post_jobs_returns(start_api: Callable[..., Api]):
    text = (ROOT / "docs" / "api.md").read_text()
    section = text[text.index("\n## Jobs\n") : text.index("\n## Idempotency\n")]
    (line,) = re.findall(r'^\{"id":.*\}$', section, re.MULTILINE)
    documented = json.loads(line)
    api = start_api()
    response = api.post(
        "/jobs", json={"type": "sleep", "payload": {"duration": "2s"}, "max_attempts": 3}
    )
    assert response.status_code == 201
    answered = response.json()
    assert list(documented) == list(answered)
    same = ("type", "payload", "status", "attempts", "max_attempts", "queue", "priority")
    assert {k: documented[k] for k in same} == {k: answered[k] for k in same}
