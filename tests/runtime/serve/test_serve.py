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
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from runtime import LLM, SamplingParams
from runtime.cli import main
from tests.runtime.serve.live import ready_server
from tests.tiers import slow, slow_cases

MODEL = "tiny-stdlib"
OPTIONS = ["--max-num-seqs", "8", "--max-model-len", "256", "--prefix-caching", "off"]


@pytest.fixture(scope="module")
def server() -> Iterator[str]:
    """The base URL of a live `jmamba serve` (stopped after the module)."""
    with ready_server([*OPTIONS, "--model", MODEL, "--warmup", "decode"]) as live:
        yield live.base


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
    served, alone = concurrent_and_alone(client, llm)
    assert served == alone


def concurrent_and_alone(client: openai.OpenAI, llm: LLM) -> tuple[list[str], list[str | None]]:
    """32 clients of mixed prompt and answer lengths at once: (what the server gave each, what
    `llm` gives each prompt alone)."""
    prompts = [("def " * (1 + i % 5)) + f"f{i}(" for i in range(32)]
    lengths = [4 + (i * 7) % 20 for i in range(32)]

    def ask(i: int) -> str:
        done = client.completions.create(
            model=MODEL, prompt=prompts[i], max_tokens=lengths[i], temperature=0
        )
        return done.choices[0].text

    with concurrent.futures.ThreadPoolExecutor(32) as pool:
        served = list(pool.map(ask, range(32)))
    return served, [greedy(llm, prompt, n) for prompt, n in zip(prompts, lengths, strict=True)]


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


JSON = {"content-type": "application/json"}


def post_json(url: str, body: dict) -> httpx.Response:
    """POST `body` as ASCII JSON: a lone surrogate travels as its escape, as JSON allows."""
    return httpx.post(url, content=json.dumps(body), headers=JSON, timeout=30)


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"model": MODEL, "prompt": "x", "max_tokens": -1}, "max_tokens"),
        ({"model": MODEL, "prompt": "x", "max_tokens": 0}, "max_tokens"),  # not 16 tokens
        ({"model": MODEL, "prompt": "\ud800"}, "prompt"),  # a lone surrogate: not a 500
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
    response = post_json(f"{server}/v1/completions", body)
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


CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "x"}]


@pytest.mark.parametrize(
    ("method", "path", "body", "status", "param"),
    [
        (
            "POST",
            CHAT,
            {"model": MODEL, "messages": USER, "max_completion_tokens": 0},
            400,
            "max_completion_tokens",
        ),
        ("POST", CHAT, {"model": MODEL, "messages": USER, "max_tokens": 0}, 400, "max_tokens"),
        (
            "POST",
            CHAT,
            {"model": MODEL, "messages": [{"role": "user", "content": "\ud800"}]},
            400,
            "messages",
        ),
        ("POST", CHAT, b'{"model": "tiny-stdlib", "messages": "\xff\xfe"}', 400, None),
        ("POST", CHAT, {"model": MODEL}, 400, "messages"),
        ("POST", "/v1/nowhere", {}, 404, None),
        ("GET", "/v1/completions", None, 405, None),
        ("DELETE", "/v1/models", None, 405, None),
    ],
)
def test_every_error_is_in_openais_shape(server, method, path, body, status, param):
    """Validation errors, a lone surrogate, a body that is not UTF-8, an unknown route and a wrong
    method: each answered with its status and {"error": {message, type, param, code}}."""
    content = body if isinstance(body, bytes) else json.dumps(body)
    response = httpx.request(method, f"{server}{path}", content=content, headers=JSON, timeout=30)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert param is None or error["param"] == param
    if status == 400:
        assert error["type"] == "invalid_request_error"


def test_streamed_text_offsets_continue_across_chunks(client: openai.OpenAI):
    """Each chunk's `text_offset` continues from the chunks before it: the streamed offsets are
    the whole response's."""
    ask = dict(model=MODEL, prompt="def ", max_tokens=12, temperature=0, logprobs=1)
    whole = client.completions.create(**ask).choices[0].logprobs
    chunks = client.completions.create(**ask, stream=True)
    streamed = [offset for chunk in chunks for offset in chunk.choices[0].logprobs.text_offset]
    assert streamed == whole.text_offset and streamed[-1] > 0
