"""Two processes on localhost (two CPU devices each, collectives through gloo) form one four-rank
`dp` mesh through `jax.distributed`, and give the tokens of one engine on one device (a request's
tokens do not depend on its rank: DESIGN section 5, invariant 8)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from runtime.core.sampling_params import SamplingParams
from runtime.llm import LLM
from tests.runtime.parallel.multihost_case import MAX_TOKENS, OPTIONS, PROMPTS
from tests.tiers import slow

pytestmark = slow  # two processes, each compiling its own steps

ROOT = Path(__file__).parents[3]
TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_processes_give_the_tokens_of_one(tmp_path):
    coordinator = f"127.0.0.1:{free_port()}"
    env = dict(os.environ, PYTHONPATH=str(ROOT), JAX_PLATFORMS="cpu")
    outs = [tmp_path / f"out{p}.json" for p in range(2)]
    workers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.runtime.parallel.multihost_worker",
                coordinator,
                str(p),
                str(out),
            ],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for p, out in enumerate(outs)
    ]
    try:
        logs = [w.communicate(timeout=TIMEOUT_S)[0] for w in workers]
    finally:
        for w in workers:
            w.kill()
    for w, log in zip(workers, logs, strict=True):
        assert w.returncode == 0, log[-3000:]
    got = {}
    for out in outs:
        got |= {int(i): tokens for i, tokens in json.loads(out.read_text()).items()}
    # One device in this process (LLM would start four rank processes for data_parallel_size=4).
    alone = {name: value for name, value in OPTIONS.items() if name != "data_parallel_size"}
    one = LLM("tiny-nemotron_h", warmup=False, **alone)
    expected = one.generate(PROMPTS, SamplingParams(max_tokens=MAX_TOKENS), use_tqdm=False)
    assert got == {i: o.token_ids for i, o in enumerate(expected)}
