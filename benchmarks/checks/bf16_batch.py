"""A bf16 request's output is bitwise independent of its batch under `EngineConfig.batch_invariant`
(docs/architecture.md 5.8; benchmarks/RESULTS.md, 2026-11-27).

The random bf16 bench models (`bench_engine.py`'s 0.87B NemotronH shape and four layers of its
Qwen3-Next shape; `--quick`: the tiny NemotronH twin) through the batch section's
together-and-alone comparison with the fixed-order products, norm statistics and MoE sums: N
prompts prefilled and decoded together, each again alone in a fresh engine on the same runner;
every generated token's logits must be bitwise equal and the greedy tokens the same. Without
`batch_invariant` the same comparison differs in most prompts (XLA's GEMMs and reductions round a
row by the step's shape), so this is the check that the switch covers every such operation.
"""

from __future__ import annotations

import time

from benchmarks.checks import Check, use_kernels
from benchmarks.checks.batch_invariance import Setup, compare, together_and_alone
from benchmarks.engine.models import build_model

# (bench model size, its first layers only or None, prompts, tokens each) per run.
MODELS = (("1b", None, 16, 8), ("qwen3next", 4, 16, 8))
QUICK = (("tiny", None, 3, 2),)


def run(quick: bool, families: list[str] | None = None) -> list[Check]:
    """The NemotronH-shaped bench model (Mamba2, attention, MLP) and four layers of the Qwen3-Next
    shape (Gated DeltaNet, gated attention, MoE of 512 experts), 16 prompts of 8 tokens each
    (`quick`: the tiny NemotronH twin, 3 prompts of 2 tokens); `families` does not apply."""
    del families
    use_kernels()
    return [_check(*model) for model in (QUICK if quick else MODELS)]


def _check(size: str, num_layers: int | None, num_prompts: int, max_tokens: int) -> Check:
    start = time.perf_counter()
    model = build_model(size, num_layers=num_layers)
    setup = Setup(num_prompts, max_tokens, batch_invariant=True)
    prompts, together, alone, engine = together_and_alone(model, setup)
    results = [compare(t, a) for t, a in zip(together, alone, strict=True)]
    error = max(e for e, _ in results)
    differing = sum(k is not None for _, k in results)
    detail = (
        f"{len(prompts)} prompts, max|d logits|={error:.1e} (must be 0), {differing} with other "
        f"tokens; {engine.num_variants} variants; {time.perf_counter() - start:.0f} s"
    )
    name = size if num_layers is None else f"{size} ({num_layers} layers)"
    check = Check(f"bf16 batch {name} (batch_invariant)", error == 0.0 and not differing, detail)
    print(f"   {check.name}: {check.detail}", flush=True)
    return check
