"""A real server process for the tests: `python -m nmt.serving` on 127.0.0.1 and a free port.

`Server.start(args, env)` starts it, reads the port from its "listening on" line and waits
(bounded) for /health to say ready; `request` sends one HTTP request and returns (status,
headers, body); `stop()` sends SIGTERM and returns the exit status.
"""

from __future__ import annotations

import http.client
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The flags that select each engine: the server's tests run once per engine.
ENGINE_FLAGS = {"jax": [], "ctranslate2": ["--engine", "ctranslate2"]}


def for_engine(flags: list, engine: list[str]) -> list:
    """`flags` as `engine` takes them: --buckets (the source widths JAX compiles) is left out
    for CTranslate2, which has none and refuses it."""
    if "ctranslate2" not in engine:
        return list(flags)
    at = flags.index("--buckets") if "--buckets" in flags else None
    return list(flags) if at is None else [*flags[:at], *flags[at + 2:]]
START_TIMEOUT = 300  # seconds: importing JAX, loading, compiling every search shape


class Server:
    def __init__(self, process: subprocess.Popen, args: list[str]):
        self.process = process
        self.args = args  # the command's flags
        self.log: list[str] = []
        self.port: int | None = None
        self._listening = threading.Event()
        threading.Thread(target=self._drain, daemon=True).start()

    @classmethod
    def start(cls, args: list[str], env: dict[str, str]) -> Server:
        process = subprocess.Popen(
            [sys.executable, "-m", "nmt.serving", "--port", "0", *map(str, args)], cwd=REPO,
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        server = cls(process, list(map(str, args)))
        server.wait_ready()
        return server

    def _drain(self) -> None:
        for line in self.process.stderr:
            self.log.append(line)
            found = re.search(r"listening on http://127\.0\.0\.1:(\d+)", line)
            if found:
                self.port = int(found.group(1))
                self._listening.set()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        while not self._listening.wait(0.2):
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.process.kill()
                raise RuntimeError("the server did not start:\n" + "".join(self.log))
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError("the server ended:\n" + "".join(self.log))
            if self.request("GET", "/health")[0] == 200:
                return
            time.sleep(0.2)
        self.process.kill()
        raise RuntimeError("the server never became ready:\n" + "".join(self.log))

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def request(self, method: str, path: str, body: bytes | str | dict | list | None = None,
                headers: dict[str, str] | None = None, timeout: float = 60
                ) -> tuple[int, dict[str, str], bytes]:
        headers = dict(headers or {})
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
            headers.setdefault("Content-Type", "application/json")
        if isinstance(body, str):
            body = body.encode()
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        try:
            connection.request(method, path, body=body, headers=headers)
            response = connection.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            connection.close()

    def post_json(self, path: str, payload, **kwargs) -> tuple[int, object]:
        status, _, body = self.request("POST", path, payload, **kwargs)
        return status, json.loads(body)

    def stop(self, timeout: float = 60) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise
