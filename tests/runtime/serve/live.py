"""A live `jmamba serve` for the tests: a background process on a free localhost port, its
output in a file (a full pipe would stall it), stopped at the end."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import httpx

ROOT = Path(__file__).parents[3]
START_SECONDS = 240  # load + compile on a busy 2-core machine


@dataclasses.dataclass
class LiveServer:
    """A running server: its base URL, its process, when it was started (`time.monotonic`) and
    its output so far (`output()`)."""

    base: str
    process: subprocess.Popen
    log: IO[bytes]
    started_at: float

    def output(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def serve_command(port: int, options: list[str]) -> list[str]:
    return [sys.executable, "-m", "runtime.cli", "serve", "--port", str(port), *options]


@contextlib.contextmanager
def started(options: list[str], env: dict[str, str] | None = None) -> Iterator[LiveServer]:
    """A server started with `options` (not yet ready: see `wait_ready`), stopped after."""
    port = free_port()
    with tempfile.TemporaryFile() as log:
        environment = os.environ | {"PYTHONPATH": str(ROOT)} | (env or {})
        started_at = time.monotonic()
        process = subprocess.Popen(
            serve_command(port, options), cwd=ROOT, env=environment, stderr=log, stdout=log
        )
        try:
            yield LiveServer(f"http://127.0.0.1:{port}", process, log, started_at)
        finally:
            process.terminate()
            process.wait(timeout=30)


@contextlib.contextmanager
def ready_server(options: list[str], env: dict[str, str] | None = None) -> Iterator[LiveServer]:
    """A server started with `options`, once `/health` answers 200."""
    with started(options, env) as server:
        wait_ready(server.base, server.process, server.log)
        yield server


def wait_ready(base: str, process: subprocess.Popen, log: IO[bytes]) -> None:
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log.seek(0)
            raise AssertionError(f"the server exited: {log.read().decode()[-2000:]}")
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"the server was not ready in {START_SECONDS} s")
