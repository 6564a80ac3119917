"""A local stand-in for the Hugging Face Hub's file API, so the hub code path is tested offline.

It answers exactly the routes huggingface_hub 2.x (hence transformers 5) calls for a model repo:
  GET  /api/models/{repo}[/revision/{rev}]        repo_info / model_info: `sha` and `siblings`
  GET  /api/models/{repo}/tree/{rev}[/{path}]       list_repo_tree (snapshot_download's listing)
  HEAD /{repo}/resolve/{rev}/{file}                 hf_hub_download's metadata: X-Repo-Commit,
  GET  /{repo}/resolve/{rev}/{file}                 ETag, Content-Length; then the bytes
Missing files and repos answer 404 with the hub's `X-Error-Code` (EntryNotFound, RepoNotFound),
which is what makes transformers try its next candidate file. Every request is recorded in
`server.requests`, so a test can say which files were fetched. Point `HF_ENDPOINT` at `url`.

Run alone: `python tests/hub_server.py bert-base-uncased=/path/to/folder` (prints its URL).
"""
from __future__ import annotations

import hashlib
import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse


class HubServer:
    """Serves `repos` ({repo id: local folder}) on 127.0.0.1 at a free port, in a thread."""

    def __init__(self, repos: dict[str, Path]):
        self.repos = {repo: Path(folder) for repo, folder in repos.items()}
        self.requests: list[tuple[str, str]] = []  # (method, path)
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        self.url = f"http://127.0.0.1:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> "HubServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    def downloaded(self, repo: str) -> set[str]:
        """File names whose bytes were sent (GET on /resolve/) for `repo`."""
        prefix = f"/{repo}/resolve/"
        return {path[len(prefix):].split("/", 1)[1] for method, path in self.requests
                if method == "GET" and path.startswith(prefix)}

    def files(self, repo: str) -> list[str]:
        folder = self.repos[repo]
        return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())

    def commit(self, repo: str) -> str:
        """A 40-hex commit id that changes whenever a file's bytes do."""
        digest = hashlib.sha1()
        for name in self.files(repo):
            digest.update(name.encode() + b"\0" + _sha256(self.repos[repo] / name).encode())
        return digest.hexdigest()


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _handler_for(hub: HubServer):
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):  # quiet: the test reads hub.requests instead
            pass

        def do_HEAD(self):
            self._answer(body=False)

        def do_GET(self):
            self._answer(body=True)

        def _answer(self, body: bool) -> None:
            path = unquote(urlparse(self.path).path)
            hub.requests.append((self.command, path))
            if path.startswith("/api/models/"):
                return self._api(path[len("/api/models/"):])
            if "/resolve/" in path:
                repo, rest = path[1:].split("/resolve/", 1)
                return self._resolve(repo, rest.split("/", 1)[1] if "/" in rest else "", body)
            self._error(404, "RepoNotFound", f"no route {path}")

        def _api(self, rest: str) -> None:
            """`{repo}`, `{repo}/revision/{rev}` or `{repo}/tree/{rev}[/{path}]` (repo has a '/'
            or not: bert-base-uncased vs google-bert/bert-base-uncased)."""
            for marker in ("/revision/", "/tree/"):
                repo, found, tail = rest.partition(marker)
                if found and repo in hub.repos:
                    return self._info(repo) if marker == "/revision/" else self._tree(repo, tail)
            if rest in hub.repos:
                return self._info(rest)
            self._error(404, "RepoNotFound", f"Repository {rest!r} not found")

        def _info(self, repo: str) -> None:
            self._json({"id": repo, "modelId": repo, "sha": hub.commit(repo), "private": False,
                        "gated": False, "disabled": False, "tags": [], "downloads": 0, "likes": 0,
                        "siblings": [{"rfilename": name} for name in hub.files(repo)]})

        def _tree(self, repo: str, tail: str) -> None:
            folder, under = hub.repos[repo], tail.partition("/")[2].strip("/")
            names = [n for n in hub.files(repo) if not under or n.startswith(under + "/")]
            if under and not names:
                return self._error(404, "EntryNotFound", f"{under} not found in {repo}")
            entries = []
            for name in names:
                path = folder / name
                entries.append({"type": "file", "path": name, "size": path.stat().st_size,
                                "oid": hashlib.sha1(path.read_bytes()).hexdigest(),
                                "lfs": {"oid": _sha256(path), "size": path.stat().st_size,
                                        "pointerSize": 134}})
            self._json(entries)

        def _resolve(self, repo: str, name: str, body: bool) -> None:
            if repo not in hub.repos:
                return self._error(404, "RepoNotFound", f"Repository {repo!r} not found")
            path = hub.repos[repo] / name
            if not name or not path.is_file() or ".." in Path(name).parts:
                return self._error(404, "EntryNotFound", f"{name} not found in {repo}",
                                   commit=hub.commit(repo))
            data = path.read_bytes()
            self.send_response(200)
            self.send_header("X-Repo-Commit", hub.commit(repo))
            self.send_header("ETag", f'"{_sha256(path)}"')
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Type", "application/octet-stream")
            self.end_headers()
            if body:
                self.wfile.write(data)

        def _json(self, value) -> None:
            data = json.dumps(value).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        def _error(self, status: int, code: str, message: str, commit: str | None = None) -> None:
            data = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            if commit:
                self.send_header("X-Repo-Commit", commit)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

    return Handler


def hub_env(url: str, home: Path, base: dict | None = None) -> dict:
    """Environment for a process that must reach only this server: HF_ENDPOINT set, offline mode
    and any inherited token removed, a fresh HF_HOME (so nothing comes from a real cache)."""
    import os

    env = dict(os.environ if base is None else base)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HUGGING_FACE_HUB_TOKEN",
                 "HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "TRANSFORMERS_CACHE", "HF_XET_CACHE"):
        env.pop(name, None)
    env.update(HF_ENDPOINT=url, HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_DISABLE_XET="1", NO_PROXY="127.0.0.1,localhost", no_proxy="127.0.0.1,localhost")
    return env


if __name__ == "__main__":
    pairs = dict(arg.split("=", 1) for arg in sys.argv[1:])
    with HubServer(pairs) as server:
        print(f"HF_ENDPOINT={server.url}", flush=True)
        threading.Event().wait()
