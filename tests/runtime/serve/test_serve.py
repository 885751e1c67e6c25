"""`jmamba serve` as users reach it: a live server (a background process on a free localhost port)
driven by the unmodified `openai` client and by raw HTTP.

Checked against the same model through `LLM.generate` in this process: greedy completions and
chat answers, streams, `n`, logprobs, 32 concurrent clients of mixed lengths (each gets the tokens
it gets alone); a client that disconnects mid-stream leaves no KV block or state slot held (read
back through /metrics, prefix caching off so nothing is cached on purpose); bad bodies get
OpenAI-style 400s and the next request is served.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import openai
import pytest

from runtime import LLM, SamplingParams
from runtime.cli import main
from tests.tiers import slow, slow_cases

ROOT = Path(__file__).parents[3]
MODEL = "tiny-stdlib"
OPTIONS = ["--max-num-seqs", "8", "--max-model-len", "256", "--prefix-caching", "off"]
START_SECONDS = 240  # load + compile on a busy 2-core machine


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The base URL of a live `jmamba serve` (stopped after the module)."""
    port = free_port()
    command = [sys.executable, "-m", "runtime.cli", "serve", "--port", str(port), *OPTIONS]
    command += ["--model", MODEL, "--warmup", "decode"]
    with tempfile.TemporaryFile() as log:  # a file, not a pipe: a full pipe would stall it
        env = os.environ | {"PYTHONPATH": str(ROOT)}
        process = subprocess.Popen(command, cwd=ROOT, env=env, stderr=log, stdout=log)
        base = f"http://127.0.0.1:{port}"
        try:
            wait_ready(base, process, log)
            yield base
        finally:
            process.terminate()
            process.wait(timeout=30)


def wait_ready(base: str, process: subprocess.Popen, log) -> None:
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
        time.sleep(0.5)
    raise AssertionError(f"the server was not ready in {START_SECONDS} s")


@pytest.fixture(scope="module")
def client(server: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server}/v1", api_key="unused", timeout=120, max_retries=0)


@pytest.fixture(scope="module")
def llm() -> LLM:
    """The served model and engine options, in this process."""
    return LLM(MODEL, max_num_seqs=8, max_model_len=256, prefix_caching="off", freeze_gc=False)


def greedy(llm: LLM, prompt: str, max_tokens: int) -> str:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    return llm.generate([prompt], params, use_tqdm=False)[0].text


def test_completions_chat_and_streams_equal_generate(client: openai.OpenAI, llm: LLM):
    done = client.completions.create(model=MODEL, prompt="def ", max_tokens=12, temperature=0)
    assert done.choices[0].text == greedy(llm, "def ", 12)
    assert done.usage.prompt_tokens == 4 and done.usage.completion_tokens == 12
    assert done.choices[0].finish_reason == "length"
    stream = client.completions.create(
        model=MODEL, prompt="import ", max_tokens=10, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in stream) == greedy(llm, "import ", 10)
    messages = [{"role": "user", "content": "print it"}]
    answer = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0
    )
    assert answer.choices[0].message.content == greedy(llm, llm.render_chat(messages), 8)
    chunks = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0, stream=True
    )
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert streamed == answer.choices[0].message.content


def test_n_logprobs_and_seeds(client: openai.OpenAI, llm: LLM):
    two = client.completions.create(
        model=MODEL, prompt="class ", max_tokens=6, temperature=1.0, n=2, seed=7, logprobs=2
    )
    assert [c.index for c in two.choices] == [0, 1]
    again = client.completions.create(
        model=MODEL, prompt="class ", max_tokens=6, temperature=1.0, n=2, seed=7, logprobs=2
    )
    assert [c.text for c in two.choices] == [c.text for c in again.choices]  # seeded
    logprobs = two.choices[0].logprobs
    assert len(logprobs.tokens) == 6 and all(len(top) == 2 for top in logprobs.top_logprobs)
    assert all(value <= 0 for value in logprobs.token_logprobs)
    chat = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "x"}],
        max_tokens=3,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(entry.top_logprobs) == 3 for entry in content)


@slow
def test_concurrent_clients_get_their_alone_tokens(client: openai.OpenAI, llm: LLM):
    prompts = [("def " * (1 + i % 5)) + f"f{i}(" for i in range(32)]
    lengths = [4 + (i * 7) % 20 for i in range(32)]

    def ask(i: int) -> str:
        done = client.completions.create(
            model=MODEL, prompt=prompts[i], max_tokens=lengths[i], temperature=0
        )
        return done.choices[0].text

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        served = list(pool.map(ask, range(32)))
    alone = [greedy(llm, prompt, n) for prompt, n in zip(prompts, lengths, strict=True)]
    assert served == alone


def test_a_client_that_disconnects_mid_stream_frees_its_blocks_and_slot(server: str):
    body = {"model": MODEL, "prompt": "def ", "max_tokens": 200, "temperature": 0, "stream": True}
    with httpx.stream("POST", f"{server}/v1/completions", json=body, timeout=60) as response:
        lines = response.iter_lines()
        assert next(lines).startswith("data: ")  # generation has started; then hang up
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        gauges = metrics(server)
        held = [gauges[name] for name in ("running", "kv_blocks_used", "state_slots_used")]
        if held == [0, 0, 0]:
            return
        time.sleep(0.2)
    raise AssertionError(f"still held after the client left: {gauges}")


def metrics(server: str) -> dict[str, float]:
    text = httpx.get(f"{server}/metrics", timeout=10).text
    wanted = ("requests_running", "kv_blocks_used", "state_slots_used")
    values = {}
    for line in text.splitlines():
        for name in wanted:
            if line.startswith(f"jmamba_{name} "):
                values[name.removeprefix("requests_")] = float(line.split()[1])
    return values


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "prompt": "x", "max_tokens": -1}, "max_tokens"),
        ({"model": "other", "prompt": "x"}, "model"),
        ({"model": MODEL, "prompt": 12}, "prompt"),
        ({"model": MODEL, "prompt": "x" * 300}, None),  # past max_model_len
        ({"model": MODEL, "prompt": "x", "temperature": "hot"}, "temperature"),
        ({"model": MODEL, "prompt": "x", "n": 0}, "n"),
        ({"model": MODEL, "prompt": "x", "echo": True}, "echo"),
        ({"model": MODEL, "prompt": "x", "presence_penalty": 3}, "presence_penalty"),
    ],
)
def test_bad_bodies_get_400_and_the_server_goes_on(server: str, body: dict, param: str | None):
    response = httpx.post(f"{server}/v1/completions", json=body, timeout=30)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["message"]
    assert param is None or error["param"] == param
    ok = httpx.post(f"{server}/v1/completions", json={"model": MODEL, "prompt": "a"}, timeout=60)
    assert ok.status_code == 200


def test_invalid_json_models_and_health(server: str):
    response = httpx.post(
        f"{server}/v1/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert response.status_code == 400 and "JSON" in response.json()["error"]["message"]
    models = httpx.get(f"{server}/v1/models", timeout=10).json()
    assert [card["id"] for card in models["data"]] == [MODEL]
    assert httpx.get(f"{server}/health", timeout=10).json() == {"status": "ok"}


@pytest.mark.parametrize("workload", slow_cases(["random", "shared-prefix", "chat"]))
def test_bench_against_the_server_prints_its_table(server: str, workload: str, capsys, tmp_path):
    out = tmp_path / "bench.json"
    argv = ["bench", "--url", server, "--workload", workload, "--num-requests", "6"]
    argv += ["--concurrency", "3", "--prompt-chars", "40", "--answer-tokens", "6", "--turns", "2"]
    assert main([*argv, "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"jmamba bench: {workload}, concurrency 3, seed " in printed
    assert "TTFT ms" in printed and "TPOT ms" in printed and "latency ms" in printed
    numbers = json.loads(out.read_text())
    assert numbers["requests"] == 6 and numbers["output_tokens_per_s"] > 0
    assert 0 < numbers["ttft_ms_p50"] <= numbers["latency_ms_p50"]
