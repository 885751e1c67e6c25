"""The front door of a live `jmamba serve` with an API key and tight limits, as users reach it:
the unmodified `openai` client with the key, raw HTTP without it.

401 without the key on every `/v1` route (`/health` and `/metrics` open, the key never in the
output); 413 for a body over `--max-request-bytes`; 400 past `--max-choices-per-request`; an
over-full queue sheds new requests with 503 and `Retry-After`, then serves normally again; a 5 MB
prompt (tokenized, then refused for its length) does not delay another client's stream by 100 ms;
`/metrics` counts the aborts and rejections and times compiles as wall time.
"""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from collections.abc import Iterator

import httpx
import openai
import pytest

from tests.runtime.serve.live import LiveServer, ready_server
from tests.tiers import slow

MODEL = "tiny-stdlib"
KEY = "sk-front-door-test-4417"
RUNNING, QUEUED = 2, 2
OPTIONS = ["--model", MODEL, "--warmup", "decode", "--prefix-caching", "off"]
OPTIONS += ["--max-num-seqs", str(RUNNING), "--max-queued-requests", str(QUEUED)]
OPTIONS += ["--max-model-len", "1024", "--max-choices-per-request", "8"]
OPTIONS += ["--max-request-bytes", str(6 * 10**6), "--api-key", KEY]
AUTH = {"authorization": f"Bearer {KEY}", "content-type": "application/json"}
LONG = {"model": MODEL, "prompt": "def ", "max_tokens": 1000, "ignore_eos": True, "stream": True}


@pytest.fixture(scope="module")
def live() -> Iterator[LiveServer]:
    with ready_server(OPTIONS) as server:
        yield server


@pytest.fixture(scope="module")
def server(live: LiveServer) -> str:
    return live.base


def post(url: str, body: dict | bytes | Iterator[bytes]) -> httpx.Response:
    """POST a body (a dict as JSON; bytes as they are; an iterator of bytes chunked)."""
    content = json.dumps(body) if isinstance(body, dict) else body
    return httpx.post(url, content=content, headers=AUTH, timeout=60)


def scrape(server: str) -> dict[str, float]:
    """Every sample of /metrics, by its name and labels."""
    text = httpx.get(f"{server}/metrics", timeout=10).text
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line and not line.startswith("#")
    }


def test_every_v1_route_needs_the_key(live: LiveServer, server: str):
    body = {"model": MODEL, "prompt": "def ", "max_tokens": 2}
    for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": KEY}):
        for method, path in (("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/v1/x")):
            response = httpx.request(method, f"{server}{path}", json=body, headers=headers)
            assert response.status_code == 401, (headers, path)
            assert response.json()["error"]["code"] == "invalid_api_key"
    assert httpx.get(f"{server}/health").status_code == 200
    assert httpx.get(f"{server}/metrics").status_code == 200
    client = openai.OpenAI(base_url=f"{server}/v1", api_key=KEY, timeout=60, max_retries=0)
    assert client.completions.create(model=MODEL, prompt="def ", max_tokens=3).choices[0].text
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server}/v1", api_key="nope", max_retries=0).models.list()
    assert KEY not in live.output()


def test_a_body_over_the_limit_gets_413(server: str):
    big = json.dumps({"model": MODEL, "prompt": "x" * (7 * 10**6)}).encode()
    declared = post(f"{server}/v1/completions", big)
    chunked = post(f"{server}/v1/completions", iter([big[:1000], big[1000:]]))
    for response in (declared, chunked):
        assert response.status_code == 413
        assert "--max-request-bytes" in response.json()["error"]["message"]
    assert post(f"{server}/v1/completions", {"model": MODEL, "prompt": "a"}).status_code == 200


def test_more_choices_than_a_request_may_ask_get_400(server: str):
    body = {"model": MODEL, "prompt": ["a", "b", "c"], "n": 3, "max_tokens": 1}
    response = post(f"{server}/v1/completions", body)
    assert response.status_code == 400 and response.json()["error"]["param"] == "n"
    assert "9 choices" in response.json()["error"]["message"]


def test_an_overfull_queue_sheds_new_requests_then_serves_again(server: str):
    """Twelve requests at once, room for four: the others get 503 with `Retry-After` at once
    (none waits), and once the four are done a new request is served."""
    before = scrape(server)
    body = {"model": MODEL, "prompt": "def ", "max_tokens": 200, "ignore_eos": True}
    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda _: post(f"{server}/v1/completions", body), range(12)))
    refused = [answer for answer in answers if answer.status_code == 503]
    assert refused and all(a.status_code in (200, 503) for a in answers)
    assert all(a.headers["retry-after"] == "1" for a in refused)
    assert all(a.json()["error"]["code"] == "overloaded" for a in refused)
    served = post(f"{server}/v1/completions", {"model": MODEL, "prompt": "a", "max_tokens": 2})
    assert served.status_code == 200
    rejected = 'jmamba_requests_rejected_total{status="503"}'
    assert scrape(server)[rejected] - before.get(rejected, 0) == len(refused)


def test_a_client_that_leaves_is_counted_as_an_abort(server: str):
    aborted = "jmamba_requests_aborted_total"
    before = scrape(server)[aborted]
    content = json.dumps(LONG)
    with httpx.stream("POST", f"{server}/v1/completions", content=content, headers=AUTH) as reply:
        assert next(reply.iter_lines()).startswith("data: ")  # generating; then hang up
    deadline = time.monotonic() + 30
    while scrape(server)[aborted] == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert scrape(server)[aborted] == before + 1


@slow  # 5 MB of tokenizing: 5 to 15 s on two busy cores
def test_a_5mb_prompt_does_not_stall_another_clients_stream(server: str):
    """The 5 MB prompt is tokenized off the event loop (without the GIL) and refused for its
    length; meanwhile another client's streams keep flowing: no gap between two chunks grows
    by 100 ms over the gaps before it."""
    gaps: list[tuple[float, float]] = []  # (arrival, gap since the chunk before)
    done = threading.Event()

    def stream() -> None:
        with httpx.Client(headers=AUTH, timeout=60) as client:
            while not done.is_set():
                last = None
                with client.stream("POST", f"{server}/v1/completions", json=LONG) as response:
                    for line in response.iter_lines():
                        now = time.perf_counter()
                        if line.startswith("data: ") and last is not None:
                            gaps.append((now, now - last))
                        last = now if line.startswith("data: ") else last

    warm = httpx.post(f"{server}/v1/completions", json=LONG, headers=AUTH, timeout=60)
    assert warm.status_code == 200  # its variants compiled: no compile falls in the window
    streamer = threading.Thread(target=stream)
    streamer.start()
    try:
        time.sleep(1.0)
        prompt = "def f(x):\n    return x\n" * (5 * 10**6 // 24)
        start = time.perf_counter()
        refused = post(f"{server}/v1/completions", {"model": MODEL, "prompt": prompt})
        end = time.perf_counter()
    finally:
        done.set()
        streamer.join(timeout=60)
    assert refused.status_code == 400 and "tokens" in refused.json()["error"]["message"]
    before = [gap for at, gap in gaps if at < start]
    during = [gap for at, gap in gaps if start <= at <= end]
    assert before and len(during) > 10, (len(before), len(during), end - start)
    assert max(during) < max(before) + 0.1, (max(before), max(during))


def test_compile_seconds_are_wall_time(live: LiveServer, server: str):
    """Never more than the server's age (a sum over parallel compiling threads would be)."""
    metrics = scrape(server)
    assert 0 < metrics["jmamba_compile_seconds_total"] < time.monotonic() - live.started_at
    assert metrics["jmamba_step_variants"] >= 2
    # The run's step store may hold some of them already (another test's server compiled them).
    assert 0 <= metrics["jmamba_step_variants_loaded"] <= metrics["jmamba_step_variants"]
    assert metrics["jmamba_step_programs_possible"] >= 2
