"""One process of the two-process data-parallel test (run by test_multihost.py, not by pytest).

    python -m tests.runtime.parallel.multihost_worker <coordinator host:port> <process id> <out>

Each process has two CPU devices; together they form a `dp` mesh of four ranks. Process p serves
prompts p, p + 2, p + 4, ... of the shared list and writes {prompt index: tokens} to <out> (JSON).
"""

from __future__ import annotations

import json
import sys

import jax

jax.config.update("jax_num_cpu_devices", 2)

from runtime.core.sampling_params import SamplingParams  # noqa: E402
from runtime.device.distributed import initialize  # noqa: E402
from runtime.llm import LLM  # noqa: E402
from tests.runtime.parallel.multihost_case import MAX_TOKENS, OPTIONS, PROMPTS  # noqa: E402


def main() -> None:
    coordinator, process_id, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    initialize(coordinator, num_processes=2, process_id=process_id)
    llm = LLM("tiny-nemotron_h", warmup=False, **OPTIONS)
    assert llm.engine.ranks == (2 * process_id, 2 * process_id + 1), llm.engine.ranks
    mine = list(range(process_id, len(PROMPTS), 2))
    outputs = llm.generate(
        [PROMPTS[i] for i in mine], SamplingParams(max_tokens=MAX_TOKENS), use_tqdm=False
    )
    with open(out, "w") as f:
        json.dump({i: o.token_ids for i, o in zip(mine, outputs, strict=True)}, f)
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
