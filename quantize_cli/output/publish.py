"""Publishing a finished checkpoint to the Hugging Face Hub (``convert --push-to-hub``, ``quantize push``).

The upload is huggingface_hub's: ``create_repo`` (and ``create_branch`` for ``--revision-out``),
then ``upload_folder``. Since huggingface_hub 2.0 ``upload_folder`` is the large-folder uploader
(the successor of ``upload_large_folder``): parallel Xet transfers, several commits for big
folders, its own live progress, and a rerun resumes (committed files are skipped, uploaded chunks
deduplicated). Without ``hf_xet`` it falls back to one commit whose LFS objects already on the Hub
are not sent again, so a rerun resumes there too. ``upload_large_folder`` (0.25 - 1.x) is not
used: it retries failures forever, and a pipeline needs an exit code.

The token is huggingface_hub's business: ``HF_TOKEN`` or the ``hf auth login`` file. It is never
passed, printed, written to a report or a card; error messages are redacted against it.
"""

from __future__ import annotations

import os

from .. import __version__
from ..errors import PublishError, UsageError, redact
from ..jsonfile import read_json_or_none
from ..repo_id import is_repo_id

# Work files (lock, resume journal) and huggingface_hub's own upload cache are never published.
IGNORE = [".*", "*/.*"]
SCHEMA_VERSION = 1


def check_repo_id(repo_id: str, flag: str = "REPO_ID") -> str:
    """`repo_id` if it is ``owner/name``; a usage error (exit 2) in the first second otherwise."""
    if not is_repo_id(repo_id):
        raise UsageError(f"{flag} {repo_id!r}: not a Hub repo id; use owner/name (letters, digits, '-', '_', '.')")
    return repo_id


def check_publishable(folder: str) -> None:
    """Refuse anything but a finished checkpoint."""
    if not os.path.isdir(folder):
        raise PublishError(f"{folder}: not a folder; push takes a finished `quantize convert` output")
    names = set(os.listdir(folder))
    if not any(n.endswith(".safetensors") for n in names) or "config.json" not in names:
        raise PublishError(f"{folder}: no config.json or *.safetensors; push takes a finished checkpoint folder")
    unfinished = {".quantize.lock", ".quantize-state.json", ".quantize-journal"} & names
    if unfinished:
        raise PublishError(f"{folder}: holds {sorted(unfinished)[0]}, an unfinished conversion; finish it with convert --resume first")


def _token_free(text: str) -> str:
    """`text` with the token huggingface_hub would use (env or login file) redacted too."""
    try:
        from huggingface_hub import get_token

        token = get_token()
    except Exception:  # noqa: BLE001 - no token is fine here
        token = None
    if token and len(token) >= 8:
        text = text.replace(token, "***")
    return redact(text)


def _why(exc: BaseException) -> str:
    first = str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ""
    return _token_free(f"{type(exc).__name__}: {first}" if first else type(exc).__name__)


def push(dst: str, repo_id: str, private: bool = False, revision_out: str | None = None, quiet: bool = False) -> dict:
    """Upload finished checkpoint `dst` to Hub model repo `repo_id` (created when missing).

    `private` applies when the repo is created; `revision_out` names the branch to commit to
    (created from the default branch when missing). Returns the publish record (``schema_version``,
    ``repo_id``, ``revision``, ``url``, ``commit``, ``files``, ``bytes``). Raises PublishError with a
    one-line, token-free message; rerunning resumes.
    """
    check_repo_id(repo_id)
    _check_branch(revision_out)
    check_publishable(dst)
    try:
        from huggingface_hub import HfApi, get_token
        from huggingface_hub.utils import disable_progress_bars
    except ImportError as exc:  # a dependency, but say so clearly if a trimmed install lacks it
        raise PublishError(f"huggingface_hub is not importable ({exc}); pip install huggingface_hub") from exc
    if not get_token():
        raise PublishError(f"{repo_id}: no Hugging Face token; set HF_TOKEN or run `hf auth login`, then rerun")
    if quiet:
        disable_progress_bars()
    from .card import retarget_card

    retarget_card(dst, repo_id)  # serve lines from the folder's own documents, whatever its format
    api = HfApi()
    step = "creating the repo"
    try:
        # private=None (not False) leaves a new repo to the owner's default visibility
        api.create_repo(repo_id, repo_type="model", private=True if private else None, exist_ok=True)
        if revision_out:
            step = f"creating branch {revision_out}"
            api.create_branch(repo_id, branch=revision_out, repo_type="model", exist_ok=True)
        step = "uploading"
        algo = "/".join(_algos(dst)) or "quantized"
        info = api.upload_folder(repo_id=repo_id, folder_path=dst, repo_type="model", revision=revision_out,
                                 ignore_patterns=list(IGNORE), commit_message=f"{algo} checkpoint written by quantize {__version__}")
    except KeyboardInterrupt:  # Ctrl-C / SIGTERM mid-upload: say what is safe, then exit 130 as usual
        import sys

        print(f"warning: upload to {repo_id} interrupted; {dst} is complete; rerun `quantize push {dst} {repo_id}` to resume",
              file=sys.stderr, flush=True)
        raise
    except Exception as exc:  # noqa: BLE001 - network, HTTP and Hub errors all mean "not published yet"
        raise PublishError(f"{repo_id}: {step} failed ({_why(exc)}); {dst} is complete; check the network and token, "
                           f"then rerun `quantize push {dst} {repo_id}` to resume") from exc
    files = [f for f in sorted(os.listdir(dst)) if not f.startswith(".") and os.path.isfile(os.path.join(dst, f))]
    return {"schema_version": SCHEMA_VERSION, "repo_id": repo_id, "revision": revision_out or "main", "private": private,
            "url": f"{api.endpoint}/{repo_id}", "commit": getattr(info, "oid", None),
            "files": len(files), "bytes": sum(os.path.getsize(os.path.join(dst, f)) for f in files)}


def check_push_options(push_to_hub: str | None, private: bool, revision_out: str | None) -> None:
    """convert's publishing flags, checked in the first second (usage errors, exit 2)."""
    if push_to_hub is None:
        if private or revision_out:
            raise UsageError(f"{'--private' if private else '--revision-out'} needs --push-to-hub REPO_ID")
        return
    check_repo_id(push_to_hub, "--push-to-hub")
    _check_branch(revision_out)


def check_push_access(repo_id: str) -> str:
    """convert --push-to-hub, before the first byte: a token, valid, that may write `repo_id`.

    Returns the token's user name. Raises PublishError (one line, token-free) where the push at the
    end would fail for want of access, so no conversion runs for nothing (issue 26: the token was
    checked only after the conversion, and the advised rerun of convert then met its own DST).
    The Hub decides for an existing repo (``auth_check(write=True)``); for a new one the namespace
    must be the user's or one of its organisations', with a token that may write there."""
    from huggingface_hub import HfApi, constants, get_token
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    fix = f"then rerun (nothing was converted), or drop --push-to-hub and run `quantize push DST {repo_id}` later"
    if constants.HF_HUB_OFFLINE:
        raise PublishError(f"--push-to-hub {repo_id}: HF_HUB_OFFLINE is set, so nothing can be published; unset it, {fix}")
    if not get_token():
        raise PublishError(f"--push-to-hub {repo_id}: no Hugging Face token; set HF_TOKEN or run `hf auth login`, {fix}")
    api = HfApi()
    try:
        me = api.whoami()
    except HfHubHTTPError as exc:
        status = getattr(getattr(exc, "response", None), "status_code", None)
        what = "the token is not valid" if status == 401 else "checking the token failed"
        raise PublishError(f"--push-to-hub {repo_id}: {what} ({_why(exc)}); set a valid HF_TOKEN or run `hf auth login`, {fix}") from exc
    except Exception as exc:  # noqa: BLE001 - network errors come in many types
        raise PublishError(f"--push-to-hub {repo_id}: cannot reach the Hub to check the token ({_why(exc)}); check the network, {fix}") from exc
    name, token = me.get("name"), (me.get("auth") or {}).get("accessToken") or {}
    if token.get("role") == "read":
        raise PublishError(f"--push-to-hub {repo_id}: the token of {name} is read-only; use a token with write access, {fix}")
    try:
        api.auth_check(repo_id, write=True)
        return name
    except GatedRepoError as exc:  # a RepositoryNotFoundError subclass: the repo exists
        raise PublishError(f"--push-to-hub {repo_id}: {name} may not write to this gated repo ({_why(exc)}); {fix}") from exc
    except RepositoryNotFoundError:
        pass  # a new repo: created at the end, in a namespace checked below
    except HfHubHTTPError as exc:
        raise PublishError(f"--push-to-hub {repo_id}: {name} may not write to this repo ({_why(exc)}); ask for write access "
                           f"or choose another repo id, {fix}") from exc
    except Exception as exc:  # noqa: BLE001
        raise PublishError(f"--push-to-hub {repo_id}: cannot reach the Hub to check write access ({_why(exc)}); {fix}") from exc
    problem = _namespace_problem(repo_id.split("/")[0], name, me.get("orgs") or [], token)
    if problem:
        raise PublishError(f"--push-to-hub {repo_id}: {problem}; {fix}")
    return name


def _namespace_problem(owner: str, name: str, orgs: list, token: dict) -> str | None:
    """Why the token of user `name` cannot create a repo under `owner` (whoami's facts), or None."""
    roles = {o.get("name"): o.get("roleInOrg") for o in orgs if isinstance(o, dict)}
    if owner != name and owner not in roles:
        mine = ", ".join([name, *sorted(r for r in roles if r)])
        return f"{name} cannot create repos under {owner!r} (the namespaces of this token: {mine})"
    if owner in roles and roles[owner] == "read":
        return f"{name} has the read role in the organisation {owner!r}; ask for write access"
    if token.get("role") == "fineGrained":
        scoped = (token.get("fineGrained") or {}).get("scoped") or []
        if not any((e.get("entity") or {}).get("name") == owner and "repo.write" in (e.get("permissions") or [])
                   for e in scoped if isinstance(e, dict)):
            return f"the fine-grained token of {name} has no repo.write permission on {owner!r}; grant it, or create the repo first"
    return None


def _check_branch(revision_out: str | None) -> None:
    if revision_out is not None and (not revision_out.strip() or revision_out.startswith(("-", "/")) or " " in revision_out):
        raise UsageError(f"--revision-out {revision_out!r}: not a branch name")


def push_after_convert(dst: str, repo_id: str, private: bool, revision_out: str | None, quiet: bool, doc: dict,
                       report: str | None) -> dict:
    """convert --push-to-hub: push the finished DST; record the outcome in the report either way."""
    from ..checkpoint.durable import write_json

    try:
        record = push(dst, repo_id, private=private, revision_out=revision_out, quiet=quiet)
    except PublishError as exc:
        doc["publish"] = {"schema_version": SCHEMA_VERSION, "repo_id": repo_id, "status": "error", "error": exc.message}
        if report:
            write_json(report, doc)
        raise
    doc["publish"] = {**record, "status": "ok"}
    if report:
        write_json(report, doc)
    return record


def _algos(folder: str) -> list[str]:
    """The algorithms a finished checkpoint holds, from its format's documents (the commit message)."""
    from ..formats import detect_output

    fmt, _ = detect_output(folder)
    return sorted(fmt.output_facts(folder)["algos"])
