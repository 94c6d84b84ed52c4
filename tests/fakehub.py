"""A fake Hugging Face Hub on 127.0.0.1: just the endpoints huggingface_hub's uploads call.

Serves ``whoami``, ``auth_check(write=True)``, ``create_repo``, ``create_branch``, ``preupload``,
the LFS batch API with basic single-PUT transfers, and ``commit`` (ndjson). It stores what a commit would make visible: per repo, per
branch, ``{path: bytes}``, plus the LFS objects by sha256. Every request is logged with the
Authorization header it carried, so tests can check the token was sent (and never echoed).

Faults: ``drop_puts`` (file names whose LFS PUT gets its connection dropped without a response),
``echo_token_status`` (answer every API call with this HTTP status and a body quoting the token,
as a hostile proxy might), ``commit_status`` (answer commits with this HTTP status: the Hub failing
after the access checks passed). ``lfs_paths``: which files the server asks to be sent through LFS
(``*.safetensors`` by default, as the Hub does); everything else is committed inline.

The server runs on daemon threads, refuses bodies over 64 MB, and shuts itself down after
`lifetime_s` seconds should a test forget to stop it.
"""

from __future__ import annotations

import base64
import fnmatch
import hashlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

MAX_BODY = 64 << 20


class FakeHub:
    def __init__(self, lfs_paths=("*.safetensors",), lifetime_s: float = 120.0):
        self.repos: dict[str, dict] = {}  # repo_id -> {"private": bool, "branches": {name: {path: bytes}}}
        self.lfs: dict[str, bytes] = {}  # sha256 -> bytes
        self.requests: list[dict] = []  # {"method", "path", "auth"}
        self.puts: list[str] = []  # LFS object names PUT successfully, in order
        self.drop_puts: set[str] = set()
        self.echo_token_status: int | None = None
        self.commit_status: int | None = None
        self.heads: dict[tuple[str, str], str] = {}  # (repo, branch) -> commit oid
        self.validated_yaml: list[str] = []  # card metadata sent to /api/validate-yaml
        self.lfs_paths = tuple(lfs_paths)
        # whoami-v2's answer for any token; `read_only` repos refuse the write check (403)
        self.whoami = {"name": "me", "orgs": [{"name": "team", "roleInOrg": "write"}],
                       "auth": {"type": "access_token", "accessToken": {"role": "write"}}}
        self.read_only: set[str] = set()
        self._lock = threading.Lock()
        self._pending: dict[str, str] = {}  # sha256 -> file name (for faults and logs)
        handler = type("Handler", (_Handler,), {"hub": self})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        self._timer = threading.Timer(lifetime_s, self.stop)
        self._timer.daemon = True

    def start(self) -> "FakeHub":
        self._thread.start()
        self._timer.start()
        return self

    def stop(self) -> None:
        self._timer.cancel()
        self.server.shutdown()
        self.server.server_close()

    def files(self, repo_id: str, branch: str = "main") -> dict[str, bytes]:
        return dict(self.repos[repo_id]["branches"].get(branch, {}))


class _Handler(BaseHTTPRequestHandler):
    hub: FakeHub
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):  # quiet
        pass

    # -- plumbing -------------------------------------------------------------------------
    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        if n > MAX_BODY:
            raise ValueError("body too large")
        return self.rfile.read(n) if n else b""

    def _send(self, status: int, doc=None, headers: dict | None = None) -> None:
        data = json.dumps(doc if doc is not None else {}).encode()
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _log(self) -> None:
        with self.hub._lock:
            self.hub.requests.append({"method": self.command, "path": self.path, "auth": self.headers.get("Authorization")})

    def do_POST(self):
        self._log()
        body = self._body()
        hub = self.hub
        if hub.echo_token_status and self.path.startswith("/api/"):
            return self._send(hub.echo_token_status, {"error": f"rejected credentials {self.headers.get('Authorization')}"})
        path = self.path.split("?", 1)[0]
        if path == "/api/repos/create":
            doc = json.loads(body)
            repo = f"{doc['organization']}/{doc['name']}" if doc.get("organization") else doc["name"]
            with hub._lock:
                if repo in hub.repos:
                    return self._send(409, {"error": "You already created this model repo", "url": f"{hub.url}/{repo}"})
                hub.repos[repo] = {"private": doc.get("visibility") == "private", "branches": {"main": {}}}
            return self._send(200, {"url": f"{hub.url}/{repo}", "name": repo})
        if path == "/api/validate-yaml":  # model card metadata: must be a YAML mapping
            import yaml

            doc = json.loads(body)
            with self.hub._lock:
                self.hub.validated_yaml.append(doc.get("content", ""))
            text = doc.get("content") or ""
            parts = text.split("---\n", 2) if text.startswith("---\n") else ["", "", ""]
            meta = yaml.safe_load(parts[1]) if len(parts) == 3 else None
            return self._send(200 if isinstance(meta, dict) else 400, {} if isinstance(meta, dict) else {"error": "not a mapping"})
        parts = path.strip("/").split("/")
        if parts[:2] == ["api", "models"] and len(parts) >= 6:
            repo, action, rev = f"{parts[2]}/{parts[3]}", parts[4], "/".join(parts[5:])
            if repo not in hub.repos:
                return self._send(404, {"error": "Repository not found"})
            if action == "branch":
                hub.repos[repo]["branches"].setdefault(rev, dict(hub.repos[repo]["branches"]["main"]))
                return self._send(200, {})
            if action == "preupload":
                return self._preupload(repo, rev, json.loads(body))
            if action == "commit":
                if hub.commit_status:
                    return self._send(hub.commit_status, {"error": "Service Unavailable"})
                return self._commit(repo, rev, body)
        if path.endswith(".git/info/lfs/objects/batch"):
            return self._batch(json.loads(body))
        return self._send(404, {"error": f"fake hub: no route for POST {path}"})

    def do_GET(self):
        self._log()
        parts = self.path.split("?", 1)[0].strip("/").split("/")
        if self.hub.echo_token_status and parts[:1] == ["api"]:
            return self._send(self.hub.echo_token_status, {"error": f"rejected credentials {self.headers.get('Authorization')}"})
        if parts == ["api", "whoami-v2"]:
            if not self.headers.get("Authorization"):
                return self._send(401, {"error": "Invalid credentials in Authorization header"})
            return self._send(200, self.hub.whoami)
        if parts[:2] == ["api", "models"] and parts[4:] == ["auth-check", "write"]:  # HfApi.auth_check(write=True)
            repo = f"{parts[2]}/{parts[3]}"
            if repo not in self.hub.repos:
                return self._send(404, {"error": "Repository not found"}, {"X-Error-Code": "RepoNotFound"})
            if repo in self.hub.read_only:
                return self._send(403, {"error": "You don't have write access"}, {"X-Error-Message": "no write access"})
            return self._send(200, {})
        if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "revision":
            repo, rev = f"{parts[2]}/{parts[3]}", "/".join(parts[5:])
            if repo in self.hub.repos and rev in self.hub.repos[repo]["branches"]:
                return self._send(200, {"id": repo, "sha": self.hub.heads.get((repo, rev), "0" * 40),
                                        "private": self.hub.repos[repo]["private"]})
            return self._send(404, {"error": "Revision not found"})
        return self._send(404, {"error": f"fake hub: no route for GET {self.path}"})

    def do_PUT(self):
        self._log()
        oid = self.path.rsplit("/", 1)[-1]
        name = self.hub._pending.get(oid, oid)
        if name in self.hub.drop_puts:
            self.rfile.read(min(int(self.headers.get("Content-Length") or 0), 1024))
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)  # no response: the connection just drops
            return
        data = self._body()
        if hashlib.sha256(data).hexdigest() != oid:
            return self._send(400, {"error": "sha256 mismatch"})
        with self.hub._lock:
            self.hub.lfs[oid] = data
            self.hub.puts.append(name)
        return self._send(200, {})

    # -- endpoints ------------------------------------------------------------------------
    def _preupload(self, repo: str, rev: str, doc: dict):
        current = self.hub.repos[repo]["branches"].get(rev, {})
        files = []
        for f in doc["files"]:
            lfs = any(fnmatch.fnmatch(f["path"], p) for p in self.hub.lfs_paths)
            entry = {"path": f["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False}
            if f["path"] in current:
                entry["oid"] = _oid(current[f["path"]], lfs)
            files.append(entry)
        return self._send(200, {"files": files, "commitOid": "0" * 40})

    def _batch(self, doc: dict):
        out = []
        for obj in doc["objects"]:
            entry = {"oid": obj["oid"], "size": obj["size"]}
            if obj["oid"] not in self.hub.lfs:  # already stored objects get no action: nothing to send
                entry["actions"] = {"upload": {"href": f"{self.hub.url}/lfs-upload/{obj['oid']}"}}
            out.append(entry)
        return self._send(200, {"transfer": "basic", "objects": out})

    def _commit(self, repo: str, rev: str, body: bytes):
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        new = {}
        for item in lines:
            key, value = item["key"], item["value"]
            if key == "file":
                new[value["path"]] = base64.b64decode(value["content"])
            elif key == "lfsFile":
                if value["oid"] not in self.hub.lfs:
                    return self._send(422, {"error": f"LFS object {value['oid']} was never uploaded"})
                new[value["path"]] = self.hub.lfs[value["oid"]]
        with self.hub._lock:
            branch = self.hub.repos[repo]["branches"].setdefault(rev, {})
            branch.update(new)
            oid = hashlib.sha1(repr(sorted((k, hashlib.sha256(v).hexdigest()) for k, v in branch.items())).encode()).hexdigest()
            self.hub.heads[(repo, rev)] = oid
        return self._send(200, {"commitUrl": f"{self.hub.url}/{repo}/commit/{oid}", "commitOid": oid, "success": True})


def _oid(data: bytes, lfs: bool) -> str:
    """The oid the Hub reports for a stored file: sha256 for LFS files, the git blob sha1 otherwise."""
    if lfs:
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def register_pending(hub: FakeHub, folder: str) -> None:
    """Map each file's sha256 to its name, so faults can target files by name."""
    import os

    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if os.path.isfile(path):
            with open(path, "rb") as f:
                hub._pending[hashlib.sha256(f.read()).hexdigest()] = name
