"""`jmamba serve --ray-replicas 2` on a local Ray cluster this module starts (2 CPUs, no
dashboard), driven by the unmodified `openai` client.

The command runs as users run it, a process of its own (it joins the module's cluster through
RAY_ADDRESS). Before it, the same options with `--ray-routing power-of-two` (Serve's default
router) are deployed from this process and given the same workload, the baseline: sessions that
share a prefix per session, sent turn by turn, interleaved. Each answer names its replica
(`x-jmamba-replica`) and its prompt tokens taken from the prefix cache
(`usage.prompt_tokens_details.cached_tokens`, the replica engine's own count). Prefix-affinity
routing keeps every session on one replica, so every later turn hits; power-of-two choices
scatters them. Then the API's routes and errors through the replicas, and last a replica killed
while it streams: its requests end with an error (none hangs) and the next ones are served by
the other replica, within FAILOVER_SECONDS.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from typing import IO

import openai
import pytest
import ray
from ray import serve

from runtime.cli import parser
from runtime.cli import ray_serve as ray_options
from runtime.cli.serve import served_app
from runtime.ray_serve.application import start
from tests.runtime.ray_serve.command import COMMAND  # the README's
from tests.runtime.serve.live import ROOT, free_port, wait_ready

# Ray starts some of its processes with a preexec_fn, which runs JAX's at-fork hook; in a worker
# whose JAX earlier modules initialised, the hook warns of a deadlock. The child execs at once and
# never runs JAX, so the warning does not apply here.
pytestmark = pytest.mark.filterwarnings("ignore:os.fork\\(\\) was called:RuntimeWarning")

MODEL = "tiny-stdlib"
SESSIONS, TURNS = 8, 3
FAILOVER_SECONDS = 15.0  # from the kill to the in-flight errors and the first answer elsewhere
REPLICA = "x-jmamba-replica"


@dataclasses.dataclass(frozen=True)
class Turn:
    session: int
    turn: int
    replica: str
    prompt_tokens: int
    cached_tokens: int


def command_args(port: int, *extra: str) -> list[str]:
    """The README command's arguments (after `jmamba`), on `port`."""
    words = shlex.split(COMMAND.replace("--port 8000", f"--port {port}"))
    return [*words[1:], *extra]


@pytest.fixture(scope="module")
def cluster() -> Iterator[str]:
    """A local Ray cluster (its GCS address); the replicas compile into one shared cache."""
    with tempfile.TemporaryDirectory(prefix="jmamba-ray-") as cache:
        # Ray's workers inherit this process's environment at `ray.init`.
        os.environ["JMAMBA_COMPILE_CACHE"] = cache
        try:
            context = ray.init(
                num_cpus=2,
                include_dashboard=False,
                object_store_memory=100 * 2**20,
                log_to_driver=False,
            )
        finally:
            os.environ["JMAMBA_COMPILE_CACHE"] = "off"  # conftest's value, for this process
        try:
            yield context.address_info["gcs_address"]
        finally:
            serve.shutdown()
            ray.shutdown()


@pytest.fixture(scope="module")
def port(cluster: str) -> int:
    return free_port()


def client_of(port: int) -> openai.OpenAI:
    return openai.OpenAI(
        base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", timeout=60, max_retries=0
    )


def prefix_of(session: int) -> str:
    """A session's shared prefix (~190 tokens: two whole 64-token cache blocks and more),
    unlike the others' from its first line."""
    lines = [f"# session {session}: helpers for table {session * 7 + 3}"]
    lines += [f"def f{session}_{i}(x):\n    return x * {session + i} + {i}" for i in range(4)]
    return "\n".join(lines) + "\n"


def workload(client: openai.OpenAI) -> list[Turn]:
    """SESSIONS sessions of TURNS turns, sent one at a time, turn by turn across sessions."""
    turns = []
    for turn in range(TURNS):
        for session in range(SESSIONS):
            raw = client.completions.with_raw_response.create(
                model=MODEL,
                prompt=prefix_of(session) + f"# turn {turn}\n",
                max_tokens=2,
                temperature=0,
            )
            usage = raw.parse().usage
            cached = usage.prompt_tokens_details.cached_tokens
            turns.append(Turn(session, turn, raw.headers[REPLICA], usage.prompt_tokens, cached))
    return turns


def hit_rate(turns: list[Turn]) -> float:
    """Prompt tokens the replicas' prefix caches supplied, of all prompt tokens."""
    return sum(t.cached_tokens for t in turns) / sum(t.prompt_tokens for t in turns)


@pytest.fixture(scope="module")
def baseline(port: int) -> list[Turn]:
    """The workload under power-of-two routing: the command's options deployed from here."""
    args = parser().parse_args(command_args(port, "--ray-routing", "power-of-two"))
    start(functools.partial(served_app, args), ray_options.options(args))
    try:
        with client_of(port) as client:
            return workload(client)
    finally:
        serve.delete("jmamba")  # one application at a time on the 2-CPU cluster


@pytest.fixture(scope="module")
def server(cluster: str, port: int, baseline: list[Turn]) -> Iterator[str]:
    """The README's command as a process on the module's cluster (once the baseline's
    application is gone); its base URL once /health answers 200."""
    environment = os.environ | {"PYTHONPATH": str(ROOT), "RAY_ADDRESS": cluster}
    command = [sys.executable, "-m", "runtime.cli", *command_args(port)]
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(command, cwd=ROOT, env=environment, stdout=log, stderr=log)
        try:
            base = f"http://127.0.0.1:{port}"
            wait_ready(base, process, log)
            yield base
        finally:
            stopping = time.monotonic()
            process.send_signal(signal.SIGTERM)
            code = process.wait(timeout=60)
            print(f"\nthe command stopped in {time.monotonic() - stopping:.1f} s, exit {code}")
        assert code == 0, _tail(log)


def _tail(log: IO[bytes]) -> str:
    log.seek(0)
    return log.read().decode(errors="replace")[-3000:]


@pytest.fixture
def client(server: str) -> Iterator[openai.OpenAI]:
    with client_of(int(server.rsplit(":", 1)[1])) as client:
        yield client


def test_prefix_affinity_keeps_sessions_on_their_replica(
    client: openai.OpenAI, baseline: list[Turn]
):
    routed = workload(client)
    replicas = {s: {t.replica for t in routed if t.session == s} for s in range(SESSIONS)}
    assert all(len(held) == 1 for held in replicas.values()), replicas
    assert len({t.replica for t in routed}) == 2  # the sessions spread over both replicas
    later = [t for t in routed if t.turn > 0]
    assert all(t.cached_tokens >= 128 for t in later), later  # every later turn hit its prefix
    assert all(t.cached_tokens == 0 for t in routed if t.turn == 0)
    baseline_hits = sum(t.cached_tokens > 0 for t in baseline)
    print(
        f"\nprefix-cache token hit rate: prefix affinity {hit_rate(routed):.3f} "
        f"({len(later)} of {len(routed)} requests hit), power of two {hit_rate(baseline):.3f} "
        f"({baseline_hits} of {len(baseline)} hit)"
    )
    # Power of two keeps all of a session's turns together with probability 1/4 per session.
    assert baseline_hits < len(later) and hit_rate(baseline) < hit_rate(routed)


def test_the_api_through_the_replicas(client: openai.OpenAI):
    assert [card.id for card in client.models.list().data] == [MODEL]
    prompt = prefix_of(0) + "# api\n"
    whole = client.completions.create(model=MODEL, prompt=prompt, max_tokens=12, temperature=0)
    stream = client.completions.create(
        model=MODEL, prompt=prompt, max_tokens=12, temperature=0, stream=True
    )
    assert "".join(chunk.choices[0].text for chunk in stream) == whole.choices[0].text
    assert whole.usage.completion_tokens == 12
    messages = [{"role": "user", "content": "print it"}]
    answer = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0
    )
    chunks = client.chat.completions.create(
        model=MODEL, messages=messages, max_tokens=8, temperature=0, stream=True
    )
    streamed = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
    assert streamed == answer.choices[0].message.content
    with pytest.raises(openai.BadRequestError, match="is not served here"):  # the replica's 400
        client.completions.create(model="another", prompt="x", max_tokens=1)


def test_a_killed_replica_fails_its_requests_and_the_other_serves(client: openai.OpenAI):
    prompt = prefix_of(SESSIONS) + "# failover\n"
    long = {"model": MODEL, "prompt": prompt, "max_tokens": 400, "temperature": 0}
    long["extra_body"] = {"ignore_eos": True}
    # Long requests of one prefix: its replica (the victim) takes them until it runs more than
    # --max-num-seqs (2, the router's imbalance threshold) beyond the other, which takes the
    # rest. A whole (unstreamed) one among the victim's first three: it answers only at the end.
    first = client.completions.with_raw_response.create(**long, stream=True)
    victim = first.headers[REPLICA]
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        whole = pool.submit(_whole_answer, client, long)
        time.sleep(0.3)  # routed by now (to the victim, one request ahead of the other)
        streams = [first]
        streams += [client.completions.with_raw_response.create(**long, stream=True)]
        streams += [client.completions.with_raw_response.create(**long, stream=True)]
        on_victim = [s.headers[REPLICA] == victim for s in streams]
        opened = [s.parse() for s in streams]
        next(iter(opened[0]))  # the victim's tokens are coming
        killed = time.monotonic()
        ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
        answered = pool.submit(_first_answer_elsewhere, client, prompt, victim, killed)
        ended = list(pool.map(functools.partial(_end_of, since=killed), opened))
        served, recovered, refused = answered.result()
        whole_error = whole.result()
    for lost, (end, _) in zip(on_victim, ended, strict=True):  # the victim's fail, others finish
        if lost:  # the ingress's error event, not a connection cut short
            assert isinstance(end, openai.APIError) and "replica serving this stream died" in str(
                end
            ), end
        else:
            assert end is None, end
    assert isinstance(whole_error, openai.APIStatusError) and whole_error.status_code == 503
    assert "replica serving this request died" in str(whole_error)
    failed = max(seconds for lost, (_, seconds) in zip(on_victim, ended, strict=True) if lost)
    assert served != victim
    print(
        f"\nfailover: {sum(on_victim)} of {len(opened)} streams and a whole request on the "
        f"killed replica, the streams failed within {failed:.2f} s of the kill; the next "
        f"request answered {recovered:.2f} s after it (after {refused} 503s)"
    )
    assert failed < FAILOVER_SECONDS and recovered < FAILOVER_SECONDS
    again = client.completions.with_raw_response.create(model=MODEL, prompt=prompt, max_tokens=2)
    assert again.headers[REPLICA] != victim


def _whole_answer(client: openai.OpenAI, request: dict) -> BaseException | None:
    """The error of an unstreamed request, or None if it was answered."""
    try:
        client.completions.create(**request, timeout=FAILOVER_SECONDS)
    except Exception as error:
        return error
    return None


def _end_of(stream: openai.Stream, since: float) -> tuple[BaseException | None, float]:
    """How a stream ends (the error it raises, or None if it finished) and when (seconds after
    `since`)."""
    try:
        for _ in stream:
            pass
    except Exception as error:
        return error, time.monotonic() - since
    finally:
        stream.close()
    return None, time.monotonic() - since


def _first_answer_elsewhere(
    client: openai.OpenAI, prompt: str, victim: str, killed: float
) -> tuple[str, float, int]:
    """The replica that first answers `prompt` after the kill, when (seconds after it), and
    how many requests were refused before it (503 at once: the router still knew the dead
    replica)."""
    refused = 0
    while time.monotonic() - killed < FAILOVER_SECONDS:
        try:
            raw = client.completions.with_raw_response.create(
                model=MODEL, prompt=prompt, max_tokens=2, timeout=FAILOVER_SECONDS
            )
        except openai.APIStatusError as error:
            assert error.status_code == 503, error
            refused += 1
            continue
        return raw.headers[REPLICA], time.monotonic() - killed, refused
    raise AssertionError(f"no replica answered within {FAILOVER_SECONDS} s of the kill")
