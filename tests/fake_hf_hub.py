"""A local stand-in for the Hugging Face Hub's HTTP API (no network in tests): what `snapshot_download`
asks of it (huggingface_hub 2.4) -- a repository's file list at a revision, and each file by HEAD and
GET under /{repo}/resolve/{revision}/{path} -- for repositories held in memory. Point a process at it
with HF_ENDPOINT=server.url. It records every path requested (`served`)."""
from __future__ import annotations

import hashlib
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, bytes]], revisions: tuple[str, ...] = ("main", COMMIT)):
        self.repos, self.revisions, self.served = repos, revisions, []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_HEAD(self):
                self._answer(body=False)

            def do_GET(self):
                self._answer(body=True)

            def _answer(self, body: bool):
                path = unquote(self.path.split("?")[0])
                hub.served.append((self.command, path))
                if path.startswith("/api/models/"):
                    rest = path[len("/api/models/"):]
                    if "/tree/" in rest:                      # list_repo_tree: every file, one page
                        repo, _, rev = rest.partition("/tree/")
                        if repo not in hub.repos:
                            return self._error(404, "RepoNotFound")
                        if rev.rstrip("/") not in hub.revisions:
                            return self._error(404, "RevisionNotFound")
                        entries = [{"type": "file", "path": f, "size": len(b), "oid": hashlib.sha1(b).hexdigest()}
                                   for f, b in sorted(hub.repos[repo].items())]
                        return self._send(200, json.dumps(entries).encode(), {"Content-Type": "application/json"},
                                          body)
                    repo, _, rev = rest.partition("/revision/")
                    repo = repo.rstrip("/")
                    if repo not in hub.repos:
                        return self._error(404, "RepoNotFound")
                    if rev and rev not in hub.revisions:
                        return self._error(404, "RevisionNotFound")
                    data = json.dumps({"id": repo, "modelId": repo, "sha": COMMIT, "private": False,
                                       "siblings": [{"rfilename": f} for f in sorted(hub.repos[repo])]}).encode()
                    return self._send(200, data, {"Content-Type": "application/json"}, body)
                parts = path.lstrip("/").split("/")
                if len(parts) >= 5 and parts[2] == "resolve":
                    repo, rev, name = "/".join(parts[:2]), parts[3], "/".join(parts[4:])
                    files = hub.repos.get(repo)
                    if files is None:
                        return self._error(404, "RepoNotFound")
                    if rev not in hub.revisions:
                        return self._error(404, "RevisionNotFound")
                    if name not in files:
                        return self._error(404, "EntryNotFound")
                    data = files[name]
                    etag = hashlib.sha256(data).hexdigest()
                    return self._send(200, data, {"X-Repo-Commit": COMMIT, "ETag": f'"{etag}"',
                                                  "Content-Type": "application/octet-stream"}, body)
                return self._error(404, "EntryNotFound")

            def _error(self, code: int, kind: str):
                data = json.dumps({"error": kind}).encode()
                self._send(code, data, {"X-Error-Code": kind, "Content-Type": "application/json"}, True)

            def _send(self, code: int, data: bytes, headers: dict, body: bool):
                self.send_response(code)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                if body and self.command != "HEAD":
                    self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def repo_from_dir(d: Path, extra: dict[str, bytes] | None = None) -> dict[str, bytes]:
    """Every file of a checkpoint directory, by its relative path, plus `extra`."""
    files = {p.relative_to(d).as_posix(): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}
    return {**files, **(extra or {})}
