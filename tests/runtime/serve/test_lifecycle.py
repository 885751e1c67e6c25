"""`jmamba serve` from start to stop: the port is bound before the model loads (a bad `--port`,
a port in use or a host not this machine's refused at once), requests while it loads and
compiles get 503 with `Retry-After`, and SIGTERM exits within seconds at every stage, letting
the requests in flight finish first.
"""

from __future__ import annotations

import json
import re
import signal
import socket
import time

import httpx
import pytest

from runtime.cli import main
from tests.runtime.serve.live import LiveServer, ready_server, started
from tests.tiers import slow

MODEL = "tiny-stdlib"
EXIT_SECONDS = 10  # a few seconds, on two busy cores
BODY = {"model": MODEL, "prompt": "def ", "max_tokens": 900, "ignore_eos": True, "stream": True}


def test_a_bad_port_is_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--port", "99999"])
    assert exited.value.code == 2 and "'99999' is not a TCP port" in capsys.readouterr().err


@pytest.mark.parametrize("host", ["203.0.113.7", "no.such.host.invalid"])  # not ours; unknown
def test_a_host_it_cannot_listen_on_is_refused_at_once(host: str, capsys):
    start = time.monotonic()
    assert main(["serve", "--host", host, "--port", "8000"]) == 2
    assert time.monotonic() - start < 2
    assert host in capsys.readouterr().err


def test_a_port_in_use_is_refused_before_the_model_loads():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with started(["--port", str(port)]) as server:  # the later --port wins
            code = server.process.wait(timeout=EXIT_SECONDS)
            output = server.output()
    assert code == 2, output
    assert f"cannot listen on 127.0.0.1:{port}" in output and "loaded" not in output


def wait_for(server: LiveServer, stage: str) -> httpx.Response:
    """/health once it says `stage`."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            health = httpx.get(f"{server.base}/health", timeout=5)
            if health.json().get("stage", health.json()["status"]) == stage:
                return health
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"never {stage}: {server.output()[-2000:]}")


def assert_terminates(server: LiveServer) -> None:
    """SIGTERM: the process is gone within EXIT_SECONDS (as uvicorn does, by the signal)."""
    start = time.monotonic()
    server.process.send_signal(signal.SIGTERM)
    code = server.process.wait(timeout=EXIT_SECONDS)
    assert time.monotonic() - start < EXIT_SECONDS
    assert code in (0, -signal.SIGTERM), server.output()[-2000:]


def assert_starting(server: LiveServer, health: httpx.Response) -> None:
    assert health.status_code == 503 and health.headers["retry-after"]
    body = {"model": MODEL, "prompt": "def "}
    early = httpx.post(f"{server.base}/v1/completions", json=body, timeout=10)
    assert early.status_code == 503 and early.headers["retry-after"]
    assert early.json()["error"]["code"] == "starting"


def counted_progress(server: LiveServer) -> dict:
    """/health's progress once the warm-up has said how many programs it warms (the engine
    thread may still be about to begin it when /health first says "compiling")."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        progress = httpx.get(f"{server.base}/health", timeout=5).json()["progress"]
        if progress["programs_total"]:
            return progress
        time.sleep(0.02)
    raise AssertionError(f"no programs counted: {server.output()[-2000:]}")


def test_sigterm_while_loading_exits_at_once():
    with started(["--model", MODEL]) as server:
        assert_starting(server, wait_for(server, "loading"))
        assert_terminates(server)


@slow  # a model load and part of a warm-up of every variant
def test_requests_while_compiling_get_503_and_sigterm_exits_in_time():
    with started(["--model", MODEL, "--warmup", "all"]) as server:
        health = wait_for(server, "compiling")
        assert_starting(server, health)
        progress = counted_progress(server)
        assert 0 <= progress["programs_ready"] <= progress["programs_total"]
        assert progress["loaded"] + progress["compiled"] <= progress["programs_ready"]
        assert progress["seconds"] >= 0
        said = re.search(r"(\d+) step programs possible \(serving bucket table\)", server.output())
        assert said is not None, server.output()[-2000:]
        assert progress["programs_total"] == int(said.group(1))  # --warmup all: all of them
        assert_terminates(server)


@slow  # a model load and warm-up
def test_sigterm_lets_the_requests_in_flight_finish():
    options = ["--model", MODEL, "--warmup", "decode", "--max-model-len", "1024"]
    with ready_server(options) as server:
        content = json.dumps(BODY)
        url = f"{server.base}/v1/completions"
        headers = {"content-type": "application/json"}
        with httpx.stream("POST", url, content=content, headers=headers, timeout=60) as reply:
            lines = reply.iter_lines()
            assert next(lines).startswith("data: ")
            server.process.send_signal(signal.SIGTERM)
            rest = [line for line in lines if line.startswith("data: ")]
        assert rest[-1] == "data: [DONE]"  # the whole answer, to its last token
        last = json.loads(rest[-2].removeprefix("data: "))
        assert last["choices"][0]["finish_reason"] == "length"
        code = server.process.wait(timeout=EXIT_SECONDS)
        assert code in (0, -signal.SIGTERM)
