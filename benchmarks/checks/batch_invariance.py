"""A request's output does not depend on its batch (docs/architecture.md 5.8, issue 8 section 2).

For each fixture model (fp32): N prompts of varied lengths (1, chunk - 1, chunk, chunk + 1,
2 chunk + 2 and random ones up to 150 tokens) are prefilled together in one engine step, then each
is run alone in a fresh `Engine` that shares the first one's `ModelRunner` (so its state slot and
KV blocks hold the garbage of earlier runs). Each request's logits at every generated token must
agree within 1e-5 and its greedy tokens must be equal. The together run and the alone runs use
different buckets (N prefill rows and the whole token budget, vs 1 row and 256 tokens), so a kernel
or algorithm choice made from the bucket shows up here. Four compiled variants per model.
"""

from __future__ import annotations

import dataclasses
import time

import numpy as np

from benchmarks.checks import Check, use_kernels
from jmamba import load_pretrained
from jmamba.model import HybridLM
from runtime.core.engine_args import EngineArgs
from runtime.core.sampling_params import SamplingParams
from runtime.engine import Engine
from tests.jmamba import fixture_runs as runs

TOL = 1e-5
ALONE_TOKENS = 256  # the prefill token bucket of a prompt run alone (>= the longest prompt)
MAX_PROMPT = 150


@dataclasses.dataclass(frozen=True)
class Setup:
    """How many prompts, how many greedy tokens each, the seed of their lengths and ids, and
    whether the engines run the batch-invariant products (`EngineConfig.batch_invariant`)."""

    num_prompts: int = 64
    max_tokens: int = 4
    seed: int = 0
    batch_invariant: bool = False


@dataclasses.dataclass
class Generated:
    """One request's greedy tokens and the logits row each was sampled from."""

    tokens: list[int]
    logits: list[np.ndarray]


def make_prompts(num: int, chunk: int, vocab: int, seed: int) -> list[list[int]]:
    """`num` prompts of random ids: lengths at the kernel chunk's edges first, then random."""
    rng = np.random.default_rng(seed)
    edges = [1, chunk - 1, chunk, chunk + 1, 2 * chunk + 2]
    lengths = [n for n in edges if 1 <= n <= MAX_PROMPT][:num]
    lengths += rng.integers(1, MAX_PROMPT + 1, size=num - len(lengths)).tolist()
    return [rng.integers(0, vocab, size=n).tolist() for n in lengths]


def engine_config(prompts: list[list[int]], setup: Setup) -> EngineArgs:
    """One config for the together and alone engines (they share the runner's compiled steps)."""
    n = len(prompts)
    budget = sum(map(len, prompts)) + 13  # room for all prompts at once, plus padding tokens
    return EngineArgs(
        max_num_seqs=n,
        max_num_batched_tokens=max(budget, ALONE_TOKENS),
        max_model_len=MAX_PROMPT + setup.max_tokens,
        decode_row_buckets=(1, n),
        prefill_row_buckets=(1, n),
        prefill_token_buckets=(ALONE_TOKENS, max(budget, ALONE_TOKENS)),
        batch_invariant=setup.batch_invariant,
    )


def generate(engine: Engine, prompts: list[list[int]], setup: Setup) -> list[Generated]:
    """Run `prompts` on `engine` to completion; every prompt must be admitted in the first step."""
    params = SamplingParams(max_tokens=setup.max_tokens, temperature=0.0, ignore_eos=True)
    ids = [engine.add_request(p, params) for p in prompts]
    out = {i: Generated([], []) for i in ids}
    first = True
    while engine.has_unfinished:
        engine.step()
        schedule, batch = engine.inspect.last_schedule, engine.inspect.last_batch
        if first and [s.num_tokens for s in schedule.prefills] != list(map(len, prompts)):
            raise ValueError("the first step did not prefill every prompt whole")
        first = False
        logits = engine.last_result.logits[0]  # the only rank
        for item, row in zip(schedule.items, batch.sample_rows, strict=True):
            request = item.request
            if item.start + item.num_tokens == request.num_tokens - 1:  # a token was sampled
                out[request.request_id].tokens.append(request.output_token_ids[-1])
                out[request.request_id].logits.append(logits[row])
    return [out[i] for i in ids]


def compare(together: Generated, alone: Generated) -> tuple[float, int | None]:
    """(max |logit delta| over the steps whose inputs agree, index of the first differing token or
    None)."""
    n = min(len(together.tokens), len(alone.tokens))
    differ = next((k for k in range(n) if together.tokens[k] != alone.tokens[k]), None)
    if differ is None and len(together.tokens) != len(alone.tokens):
        differ = n
    steps = n if differ is None else min(differ + 1, n)  # step k's inputs agree up to `differ`
    deltas = [np.abs(together.logits[k] - alone.logits[k]) for k in range(steps)]
    error = max((float(d.max()) for d in deltas), default=0.0)
    return (float("inf") if any(np.isnan(d).any() for d in deltas) else error), differ


def together_and_alone(
    model: HybridLM, setup: Setup
) -> tuple[list[list[int]], list[Generated], list[Generated], Engine]:
    """Prompts for `model`, their outputs run together and run alone, and the together engine."""
    cfg = model.config
    prompts = make_prompts(setup.num_prompts, cfg.chunk_size, cfg.vocab_size, setup.seed)
    config = engine_config(prompts, setup)
    engine = Engine(model, config, keep_logits=True)
    together = generate(engine, prompts, setup)
    alone = [generate(Engine(model, config, runner=engine.runner), [p], setup)[0] for p in prompts]
    return prompts, together, alone, engine


def check_model(name: str, model: HybridLM, setup: Setup, tol: float = TOL) -> Check:
    """The check `name`: together vs alone for `model`; every logit within `tol`, every token
    equal."""
    start = time.perf_counter()
    prompts, together, alone, engine = together_and_alone(model, setup)
    results = [compare(t, a) for t, a in zip(together, alone, strict=True)]
    error = max(e for e, _ in results)
    differing = [i for i, (_, k) in enumerate(results) if k is not None]
    lengths = [len(p) for p in prompts]
    first = ""
    if differing:
        first = f" (first: prompt {differing[0]}, token {results[differing[0]][1]})"
    detail = (
        f"{len(prompts)} prompts (lengths {min(lengths)}-{max(lengths)}), max|d logits|={error:.1e}"
        f" (tol {tol:.0e}), {len(differing)} with other tokens{first}; "
        f"{engine.num_variants} variants; {time.perf_counter() - start:.0f} s"
    )
    return Check(name, error <= tol and not differing, detail)


def run(quick: bool, families: list[str] | None = None) -> list[Check]:
    """Every fixture model (or `families`) with 64 prompts (`quick`: one model, 4 prompts, 2
    tokens each)."""
    use_kernels()
    names = families or (("mamba2",) if quick else runs.ALL)
    setup = Setup(num_prompts=4, max_tokens=2) if quick else Setup()
    checks = []
    for name in names:
        try:
            model = load_pretrained(runs.FIXTURES / name)
            checks.append(check_model(f"batch {name}", model, setup))
        except Exception as error:  # noqa: BLE001 - report it and go on with the next model
            checks.append(Check(f"batch {name}", False, f"{type(error).__name__}: {error}"[:300]))
        print(f"   {checks[-1].name}: {checks[-1].detail}", flush=True)
    return checks
