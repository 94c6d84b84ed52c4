"""Hub repo ids, by huggingface_hub's own rule (imported only when a name is checked)."""

from __future__ import annotations

import os


def is_repo_id(text: object, owner_required: bool = True) -> bool:
    """True when `text` is a Hub repo id ``owner/name`` (or a bare ``name`` with
    ``owner_required=False``) as ``huggingface_hub.utils.validate_repo_id`` accepts it: ASCII
    letters, digits, ``-``, ``_`` and ``.``, at most 96 per part, no ``--`` / ``..`` / ``.git`` end."""
    if not isinstance(text, str) or (owner_required and "/" not in text):
        return False
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
    except HFValidationError:
        return False
    return True


def local_reason(text: str, revision: str | None = None) -> str | None:
    """Why a path that does not exist is a mistyped local folder rather than a Hub repo id (None:
    it may be a repo id): it starts with ``.`` / ``/`` / ``~``, its parent folder exists here
    (``out/nonexist``), or ``HF_HUB_OFFLINE`` is set and the Hub cache holds no copy of it. Said at
    once, instead of a Hub request that fails after seconds (issue 36)."""
    if text.startswith((".", "/", "~")):
        return f"{text[0]!r} starts a local path"
    parent = os.path.dirname(text.rstrip("/"))
    if parent and os.path.isdir(parent):
        return f"its parent folder {parent} exists here"
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on") and is_repo_id(text, False):
        from huggingface_hub import try_to_load_from_cache

        if not isinstance(try_to_load_from_cache(text, "config.json", revision=revision), str):
            return "HF_HUB_OFFLINE is set and the Hub cache holds no copy of it"
    return None
