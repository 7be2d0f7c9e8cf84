import json
from pathlib import Path

from odal.api import api

CHECKED_IN = Path(__file__).resolve().parent.parent / "docs" / "api" / "openapi.json"


def test_checked_in_openapi_is_current():
    current = json.loads(json.dumps(api.get_openapi_schema(), sort_keys=True, default=str))
    assert json.loads(CHECKED_IN.read_text()) == current, "docs/api/openapi.json is stale: run `make openapi`"
