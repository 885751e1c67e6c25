"""A bf16 request's output is bitwise independent of its batch under `EngineConfig.batch_invariant`
(docs/architecture.md 5.8; benchmarks/RESULTS.md, 2026-11-27).

The random bf16 bench model (`bench_engine.py`'s 0.87B NemotronH shape; `--quick`: its tiny
shape) through the batch section's together-and-alone comparison with the fixed-order products
and norm statistics: N prompts prefilled and decoded together, each again alone in a fresh engine
on the same runner; every generated token's logits must be bitwise equal and the greedy tokens the
same. Without `batch_invariant` the same comparison differs in most prompts (XLA's GEMMs and
reductions round a row by the step's shape), so this is the check that the switch covers every
such operation of the model.
"""

from __future__ import annotations

import time

from benchmarks.checks import Check, use_kernels
from benchmarks.checks.batch_invariance import Setup, compare, together_and_alone
from benchmarks.engine.models import build_model


def run(quick: bool, families: list[str] | None = None) -> list[Check]:
    """The bench model, 16 prompts of 8 tokens (`quick`: the tiny one, 3 prompts of 2 tokens);
    `families` does not apply."""
    del families
    use_kernels()
    size, setup = ("tiny", Setup(3, 2)) if quick else ("1b", Setup(16, 8))
    setup = Setup(setup.num_prompts, setup.max_tokens, batch_invariant=True)
    start = time.perf_counter()
    prompts, together, alone, engine = together_and_alone(build_model(size), setup)
    results = [compare(t, a) for t, a in zip(together, alone, strict=True)]
    error = max(e for e, _ in results)
    differing = sum(k is not None for _, k in results)
    detail = (
        f"{len(prompts)} prompts, max|d logits|={error:.1e} (must be 0), {differing} with other "
        f"tokens; {engine.num_variants} variants; {time.perf_counter() - start:.0f} s"
    )
    check = Check(f"bf16 batch {size} (batch_invariant)", error == 0.0 and not differing, detail)
    print(f"   {check.name}: {check.detail}", flush=True)
    return [check]
