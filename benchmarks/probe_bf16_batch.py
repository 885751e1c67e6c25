"""Is a bf16 request's output independent of its batch? The bench model (random bf16 weights,
`bench_engine.py`'s shapes) run through the batch section's together-and-alone comparison
(benchmarks/checks/batch_invariance.py): N prompts prefilled and decoded together, then each
alone in a fresh engine on the same runner; per prompt the largest |logit delta| at every
generated token and whether its greedy tokens differ. Once with XLA's GEMMs, once with
`EngineConfig.batch_invariant` (the fixed-tile products). Beside it, the norms of the model
alone: row 0 of `norm(x[:M])` against `norm(x[:1])`, how many outputs differ bitwise.

    PYTHONPATH=. python benchmarks/probe_bf16_batch.py --size 1b --prompts 16 --tokens 8
"""

from __future__ import annotations

import argparse

import jax
import jax.numpy as jnp
import numpy as np

from benchmarks.bench_matmul import row_zero_differs
from benchmarks.checks.batch_invariance import Setup, compare, together_and_alone
from benchmarks.engine.models import build_model
from jmamba.layers.norms import GroupGatedRMSNorm, RMSNorm


def norm_rounding(hidden: int, inner: int, group: int, ms: list[int]) -> list[str]:
    """Per norm and M: outputs of row 0 that differ bitwise from the M = 1 result."""
    keys = jax.random.split(jax.random.key(0), 3)
    x = jax.random.normal(keys[0], (max(ms), hidden), jnp.bfloat16)
    y = jax.random.normal(keys[1], (max(ms), inner), jnp.bfloat16)
    z = jax.random.normal(keys[2], (max(ms), inner), jnp.bfloat16)
    rms, gated = RMSNorm(hidden, 1e-5), GroupGatedRMSNorm(inner, group, 1e-5)
    norms = {
        "rmsnorm": jax.jit(lambda m: rms(x[:m]), static_argnums=0),
        "gated": jax.jit(lambda m: gated(y[:m], z[:m]), static_argnums=0),
    }
    lines = []
    for name, fn in norms.items():
        counts = [row_zero_differs(fn, m) for m in ms]
        lines.append(
            f"{name:8s} " + " ".join(f"M={m}:{c}" for m, c in zip(ms, counts, strict=True))
        )
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="1b")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--tokens", type=int, default=8)
    args = parser.parse_args(argv)
    model = build_model(args.size)
    cfg = model.config
    inner = cfg.mamba2.num_heads * cfg.mamba2.head_dim
    group = inner // cfg.mamba2.n_groups
    print(f"device={jax.devices()[0].device_kind}", flush=True)
    for line in norm_rounding(
        cfg.hidden_size, inner, group, [1, 2, 16, 64, 256, 512, 1024, 1500, 2048, 8192]
    ):
        print(line, flush=True)
    for invariant in (False, True):
        setup = Setup(args.prompts, args.tokens, batch_invariant=invariant)
        prompts, together, alone, _ = together_and_alone(model, setup)
        results = [compare(t, a) for t, a in zip(together, alone, strict=True)]
        exact = sum(e == 0.0 for e, _ in results)
        differing = sum(k is not None for _, k in results)
        print(
            f"batch_invariant={invariant}: {len(prompts)} prompts, max|d logits|="
            f"{max(e for e, _ in results):.2e}, bitwise equal logits {exact}/{len(prompts)}, "
            f"{differing} with other tokens",
            flush=True,
        )
        for i, (t, a) in enumerate(zip(together, alone, strict=True)):
            steps = [
                k
                for k in range(min(len(t.logits), len(a.logits)))
                if np.any(t.logits[k] != a.logits[k])
            ]
            if steps:
                print(f"  prompt {i} ({len(prompts[i])} tokens): logits differ at tokens {steps}")


if __name__ == "__main__":
    main()
