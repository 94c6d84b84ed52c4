"""The one JSON loader (jsonfile.py) and the Hub repo-id rule (repo_id.py)."""

import os

import pytest

from quantize_cli.jsonfile import (MISSING, NOT_JSON, NOT_OBJECT, NOT_REGULAR, NOT_UTF8, TOO_DEEP, TOO_LARGE, JsonFileError,
                                   load_json, read_json_or_none)
from quantize_cli.repo_id import is_repo_id


@pytest.mark.parametrize("content, rule, words", [
    (None, MISSING, "config.json is missing; a Hugging Face checkpoint needs it"),
    (b"{nope", NOT_JSON, "config.json is not valid JSON ("),
    (b'{"a": \xff}', NOT_UTF8, "config.json is not UTF-8 ("),
    (b"[" * 100_000 + b"]" * 100_000, TOO_DEEP, "nested too deeply"),
    (b"[1, 2]", NOT_OBJECT, "config.json must be a JSON object, got list; fix or re-download it"),
    (b"{}" + b" " * 100, TOO_LARGE, "is 102 bytes, more than the 50"),
])
def test_each_broken_rule_is_named_on_one_line(tmp_path, content, rule, words):
    path = tmp_path / "config.json"
    if content is not None:
        path.write_bytes(content)
    limit = 50 if rule == TOO_LARGE else 1 << 30
    with pytest.raises(JsonFileError) as e:
        load_json(str(path), "config.json", max_bytes=limit)
    assert e.value.rule == rule and words in e.value.message and e.value.message.startswith(str(path))
    assert "\n" not in e.value.message and e.value.exit_code == 1
    assert read_json_or_none(str(path), max_bytes=limit) is None


def test_a_folder_is_not_a_regular_file_and_a_good_file_loads(tmp_path):
    os.mkdir(tmp_path / "d.json")
    with pytest.raises(JsonFileError) as e:
        load_json(str(tmp_path / "d.json"), "x")
    assert e.value.rule == NOT_REGULAR
    (tmp_path / "ok.json").write_text('{"a": NaN}')
    assert load_json(str(tmp_path / "ok.json"), parse_constant=lambda c: c) == {"a": "NaN"}


@pytest.mark.parametrize("text, owner, ok", [
    ("me/model-FP8", True, True), ("gpt2", False, True), ("gpt2", True, False), ("a/b/c", False, False),
    ("a--b/c", True, False), ("a/b..c", True, False), ("a/b.git", True, False), ("a/b.", True, False),
    ("./x", False, False), ("é/x", True, False), ("a/" + "b" * 97, True, False), (None, True, False),
])
def test_repo_ids_follow_huggingface_hub(text, owner, ok):
    assert is_repo_id(text, owner_required=owner) is ok
