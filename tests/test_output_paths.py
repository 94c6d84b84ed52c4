"""Where --report / --json / calibrate -o may write: only over an earlier document of this tool."""

from __future__ import annotations

import json

import pytest

from quantize_cli.errors import UsageError
from quantize_cli.plan.output_paths import check_json_output


@pytest.mark.parametrize("doc", [
    {"format": "quantize-act-scales", "version": 1, "modules": {}},  # calibrate's SCALES.json: a rerun replaces it
    {"command": "check"},
    {"converter": {"name": "quantize"}, "status": "ok"},
], ids=["scales", "check-json", "report"])
def test_an_earlier_document_of_ours_may_be_replaced(tmp_path, doc):
    path = tmp_path / "x.json"
    path.write_text(json.dumps(doc))
    check_json_output(str(path), "-o")


@pytest.mark.parametrize("text", ['{"format": "something-else"}', "not json", '{"converter": {"name": "other"}, "status": "ok"}'])
def test_any_other_file_is_refused(tmp_path, text):
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(UsageError, match="exists and is not a report written by quantize"):
        check_json_output(str(path), "-o")
