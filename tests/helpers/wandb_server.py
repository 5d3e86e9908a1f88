"""A wandb-protocol server on loopback for the online tests: openwandb (PyPI ``openwandb``, FastAPI + SQLite; its
licence, CC BY-NC 4.0, keeps it a test-only dependency: requirements-test.txt), started on a free port in a
temporary data dir, and read back through its REST API (``wandb.Api`` fails against it: every query it sends is
answered "Unknown operation named ''").
"""

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from base64 import b64encode
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# The API key openwandb gives its default admin (``openwandb serve`` prints it), and the entity runs land in.
API_KEY = "local" + "0" * 40
ENTITY = "default"


@dataclass
class WandbServer:
    """A running openwandb: ``url`` (``http://127.0.0.1:<port>``) and its process."""

    url: str
    process: subprocess.Popen

    def env(self) -> dict[str, str]:
        """The environment that points wandb (and so ``logger=wandb``) at this server."""
        return {"WANDB_BASE_URL": self.url, "WANDB_API_KEY": API_KEY}

    def call(self, path: str, method: str = "GET", body: dict | None = None) -> Any:
        """The JSON answer of ``method path`` (as the admin, by the API key)."""
        data = None if body is None else json.dumps(body).encode()
        auth = "Basic " + b64encode(f"api:{API_KEY}".encode()).decode()
        headers = {"Authorization": auth, "Content-Type": "application/json"}
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    def runs(self, project: str) -> list[dict]:
        """The runs of ``project``: ``run_id``, ``display_name``, ``state``, ``config`` ({key: {"value": ...}}),
        ``summary``, ``tags``, ``group``..."""
        return self.call(f"/api/v2/projects/{ENTITY}/{project}/runs")["runs"]

    def history(self, run_id: str) -> dict[str, dict[int, float]]:
        """{metric: {step: value}} of every scalar the run logged, as the server stores it."""
        by_key = self.call(f"/api/v2/runs/{run_id}/metrics")["metrics_by_key"]
        history: dict[str, dict[int, float]] = {}
        for key, rows in by_key.items():
            steps = [row["step"] for row in rows]
            assert len(steps) == len(set(steps)), f"{key}: a step stored twice: {sorted(steps)}"
            history[key] = {row["step"]: row["value"] for row in rows}
        return history

    def make_public(self, project: str) -> None:
        """Let a browser without a login see ``project``'s pages."""
        (found,) = [p for p in self.call("/api/v2/projects")["projects"] if p["name"] == project]
        self.call(f"/api/v2/projects/{found['id']}/visibility", "PUT", {"visibility": "public"})

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()


def start_server(data_dir: Path, wait_s: float = 60.0) -> WandbServer | str:
    """openwandb serving ``data_dir`` on a free loopback port, once it answers; else why it could not start."""
    binary = shutil.which("openwandb") or str(Path(sys.executable).with_name("openwandb"))
    if not Path(binary).exists():
        return "openwandb is not installed (pip install -r requirements-test.txt)"
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = (data_dir / "server.log").open("w")
    cmd = [binary, "serve", "--host", "127.0.0.1", "--port", str(port), "--data-dir", str(data_dir / "data")]
    server = WandbServer(f"http://127.0.0.1:{port}", subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            return f"openwandb exited with {server.process.returncode}: {(data_dir / 'server.log').read_text()[-500:]}"
        try:
            server.call("/api/v2/projects")
            return server
        except (urllib.error.URLError, ConnectionError):
            time.sleep(0.5)
    server.stop()
    return f"openwandb did not answer on port {port} within {wait_s:.0f} s"
