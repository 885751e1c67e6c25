"""`jmamba serve --data-parallel-size 2` over rank processes, driven by the unmodified `openai`
client: 32 concurrent clients each get the tokens they get alone from one engine in this
process; a client that disconnects mid-stream leaves no block or slot held on any rank; a rank
process killed mid-stream ends the stream with an error and turns `/health` to 503 within a
bounded time, nothing hanging."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from runtime import LLM
from tests.runtime.ranks.cache import shared_cache_env
from tests.runtime.serve.live import LiveServer, ready_server
from tests.runtime.serve.test_serve import concurrent_and_alone, greedy, metrics

MODEL = "tiny-stdlib"
OPTIONS = ["--max-num-seqs", "8", "--max-model-len", "256", "--prefix-caching", "off"]
HELD = ("running", "kv_blocks_used", "state_slots_used")
BOUND_SECONDS = 30  # how long freeing a disconnect's blocks or failing health may take


@pytest.fixture(scope="module")
def llm() -> LLM:
    """The served model and engine options, one engine in this process."""
    return LLM(MODEL, max_num_seqs=8, max_model_len=256, prefix_caching="off", freeze_gc=False)


@pytest.fixture(scope="module")
def server(llm, tmp_path_factory) -> Iterator[LiveServer]:
    """A live server over two rank processes, sharing this process's compilation cache."""
    env = shared_cache_env(tmp_path_factory.mktemp("cache"))
    argv = [*OPTIONS, "--model", MODEL, "--data-parallel-size", "2", "--warmup", "decode"]
    with ready_server(argv, env) as live:
        yield live


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", timeout=120, max_retries=0)


def test_concurrent_clients_get_their_alone_tokens(client: openai.OpenAI, llm: LLM):
    served, alone = concurrent_and_alone(client, llm)
    assert served == alone
    stream = client.completions.create(
        model=MODEL, prompt="import ", max_tokens=10, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in stream) == greedy(llm, "import ", 10)


def test_a_client_that_disconnects_leaves_nothing_held(server: LiveServer):
    body = {"model": MODEL, "prompt": "def ", "max_tokens": 200, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server.base}/v1/completions", json=body, timeout=60) as response:
        assert next(response.iter_lines()).startswith("data: ")  # started; then hang up
    deadline = time.monotonic() + BOUND_SECONDS
    while time.monotonic() < deadline:
        gauges = metrics(server.base)
        if [gauges[name] for name in HELD] == [0, 0, 0]:
            return
        time.sleep(0.2)
    raise AssertionError(f"still held after the client left: {gauges}")


def test_a_killed_rank_fails_health_and_the_stream(server: LiveServer):  # last: kills a rank
    ranks = rank_processes(server.process.pid)
    assert len(ranks) == 2, ranks
    body = {"model": MODEL, "prompt": "def ", "max_tokens": 240, "temperature": 0, "stream": True}
    start = time.monotonic()
    with httpx.stream("POST", f"{server.base}/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")
        os.kill(ranks[0], signal.SIGKILL)  # whichever rank serves it: the group fails
        rest = list(lines)
    assert any('"error"' in line for line in rest), rest[-3:]
    assert time.monotonic() - start < BOUND_SECONDS
    health = httpx.get(f"{server.base}/health", timeout=10)
    assert health.status_code == 503 and "rank" in health.json()["error"], health.text


def rank_processes(server_pid: int) -> list[int]:
    """The pids of a server's rank processes (its children running `runtime.cli.rank_process`)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            status = (entry / "status").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode()
        except OSError:
            continue
        parent = next(line for line in status.splitlines() if line.startswith("PPid:"))
        if int(parent.split()[1]) == server_pid and "runtime.cli.rank_process" in cmdline:
            found.append(int(entry.name))
    return found
