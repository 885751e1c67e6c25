"""A bf16 request's output is bitwise independent of its batch under `EngineConfig.batch_invariant`
(docs/architecture.md 5.8; benchmarks/results/log/2026-11-27.md).

The random bf16 bench models (`benchmarks/harness/models.py`: the 0.87B NemotronH shape and four
layers of its Qwen3-Next shape; `--quick`: the tiny NemotronH twin) through the batch section's
together-and-alone comparison with the fixed-order products, norm statistics and MoE sums: N prompts
prefilled and decoded together, each again alone in a fresh engine on the same runner; every
generated token's logits must be bitwise equal and the greedy tokens the same. Without
`batch_invariant` the same comparison differs in most prompts (XLA's GEMMs and reductions round a
row by the step's shape), so this is the check that the switch covers every such operation.
"""

from __future__ import annotations

from benchmarks.checks import Check, use_kernels
from benchmarks.checks.batch_invariance import Setup, check_model
from benchmarks.harness.models import build_model

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
    """Bitwise together vs alone (tolerance 0) for the bench model `size`."""
    name = size if num_layers is None else f"{size} ({num_layers} layers)"
    model = build_model(size, num_layers=num_layers)
    setup = Setup(num_prompts, max_tokens, batch_invariant=True)
    check = check_model(f"bf16 batch {name} (batch_invariant)", model, setup, tol=0.0)
    print(f"   {check.name}: {check.detail}", flush=True)
    return check
