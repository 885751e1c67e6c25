"""What the bench serves and how it times it: its prompts (repeated random phrases, or held-out
standard-library text for the trained preset), its engine config, and serves timed over their
decode phases."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

from benchmarks.harness.serving import bench_config
from runtime.core.engine_args import EngineArgs
from runtime.core.request import Request
from runtime.core.sampling_params import SamplingParams
from runtime.core.speculative_config import SpeculativeConfig
from runtime.engine import Engine


def workload(vocab: int, count: int, phrase_len: int, repeats: int) -> list[list[int]]:
    """`count` prompts, each a random `phrase_len`-token phrase repeated `repeats` times (prompt
    lookup can hit)."""
    rng = np.random.default_rng(0)
    return [rng.integers(0, vocab, phrase_len).tolist() * repeats for _ in range(count)]


def engine_config(
    max_batch: int,
    batches: tuple[int, ...],
    max_model_len: int,
    budget: int,
    speculative: SpeculativeConfig | None,
    async_scheduling: bool = False,
    batch_invariant: bool = False,
) -> EngineArgs:
    """One engine config for every method: decode row buckets `batches`, one prefill bucket."""
    return bench_config(
        max_batch,
        budget,
        max_model_len,
        batches,
        speculative=speculative,
        async_scheduling=async_scheduling,
        batch_invariant=batch_invariant,
    )


def serve(engine: Engine, prompts: list[list[int]], max_tokens: int, first_id: int = 0) -> dict:
    """Serve every prompt to completion (request ids from `first_id`), timing the decode phase:
    from the first step after every request's prefill has retired (its first token is on the
    host; an asynchronous engine retires a step one step late, and the step that waits for the
    prefill is not decode time)."""
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    for i, prompt in enumerate(prompts, start=first_id):
        engine.add_request(prompt, params, request_id=i)
    outputs, start, before = {}, None, 0
    total = time.perf_counter()
    while engine.has_unfinished:
        scheduler = engine.inspect.scheduler
        if start is None and not scheduler.waiting and _first_tokens_retired(scheduler.running):
            before = sum(len(r.output_token_ids) for r in scheduler.running) + sum(
                len(t) for t in outputs.values()
            )
            start = time.perf_counter()
        outputs |= {o.request_id: o.token_ids for o in engine.step()}
    end = time.perf_counter()
    decode_tokens = len(prompts) * max_tokens - before
    return dict(
        outputs=outputs, decode_s=end - start, total_s=end - total, decode_tokens=decode_tokens
    )


def serve_waves(engine: Engine, prompts: list[list[int]], batch: int, max_tokens: int) -> dict:
    """`serve` the prompts `batch` at a time, each wave after the one before has finished; the
    waves' decode tokens and seconds summed."""
    waves = [
        serve(engine, prompts[i : i + batch], max_tokens, first_id=i)
        for i in range(0, len(prompts), batch)
    ]
    return dict(
        outputs={k: v for wave in waves for k, v in wave["outputs"].items()},
        **{
            key: sum(wave[key] for wave in waves)
            for key in ("decode_s", "total_s", "decode_tokens")
        },
    )


def _first_tokens_retired(running: list[Request]) -> bool:
    """Every running request is decoding and has its first token on the host."""
    return all(r.is_decode and r.output_token_ids for r in running)


def differing(outputs: dict[str, list[int]], truth: dict[str, list[int]]) -> int:
    """How many requests' tokens differ from `truth`'s."""
    return sum(outputs[request] != tokens for request, tokens in truth.items())


def stdlib_prompts(count: int, length: int) -> list[list[int]]:
    """`count` held-out prompts of `length` bytes (`scripts/measure_mtp.heldout_prompts`)."""
    sys.path.insert(0, str(Path(__file__).parents[2] / "scripts"))
    from measure_mtp import heldout_prompts
    from stdlib_corpus import load_corpus

    return heldout_prompts(load_corpus().heldout, count, length)
