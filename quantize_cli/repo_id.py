"""Hub repo ids, by huggingface_hub's own rule (imported only when a name is checked)."""

from __future__ import annotations


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
