"""Model parity with transformers on the GPU, through the Pallas kernels (Triton), in fp32.

The CPU test suite checks the same fixtures through the jnp references and, for two families,
through the kernels in interpret mode. This script runs every family through the compiled kernels
(the default dispatch on GPU) and prints the max |logit| and state errors against HF's outputs.

    PYTHONPATH=. python benchmarks/gpu_parity.py
"""

from __future__ import annotations

import jax
import numpy as np
from flax import nnx

from jmamba.config import Mixer
from jmamba.weights import load_pretrained
from tests.jmamba import test_parity as parity
from tests.jmamba.steps import build


def max_errors(name: str) -> tuple[float, float, float]:
    model = load_pretrained(parity.FIXTURES / name)
    graphdef, params = nnx.split(model)
    step = jax.jit(lambda p, c, i: nnx.merge(graphdef, p)(i, c), donate_argnums=1)
    exp = dict(np.load(parity.FIXTURES / name / "expected.npz"))
    a, b = exp["seq_a"], exp["seq_b"]
    rows = [parity.row(a, 0, len(a), parity.SLOT_A, parity.BLOCKS_A),
            parity.row(b, 0, len(b), parity.SLOT_B, parity.BLOCKS_B)]  # fmt: skip
    inputs = build([], rows, block_size=parity.BLOCK, max_blocks=parity.MAX_BLOCKS,
                   pad_prefill_rows=1, pad_tokens=5, all_logits=True)  # fmt: skip
    logits = np.asarray(step(params, parity.poisoned_caches(model), inputs)[0])
    full = max(np.abs(logits[: len(a)] - exp["logits_full_a"]).max(),
               np.abs(logits[len(a): len(a) + len(b)] - exp["logits_full_b"]).max())  # fmt: skip
    logits_a, logits_b, caches = parity.run_chunked(model, params, step, a, b)
    chunked = max(
        np.abs(logits_a - exp["logits_chunked_a"][[31, 47, *range(48, len(a))]]).max(),
        np.abs(logits_b - exp["logits_chunked_b"][[15, *range(16, len(b))]]).max(),
    )
    state = 0.0
    for i in exp["recurrent_layers"]:
        conv, rec = (np.asarray(x) for x in jax.tree.leaves(caches[i]))
        if model.config.mixers[i] == Mixer.GDN:
            rec = rec.transpose(0, 1, 3, 2)
        for slot, s in ((parity.SLOT_A, "a"), (parity.SLOT_B, "b")):
            state = max(state, np.abs(conv[slot] - exp[f"conv_{s}_{i}"][:, 1:]).max(),
                        np.abs(rec[slot] - exp[f"rec_{s}_{i}"]).max())  # fmt: skip
    return float(full), float(chunked), float(state)


def main() -> None:
    print(f"device={jax.devices()[0].device_kind}")
    print(f"{'family':12s} {'full':>9s} {'chunked':>9s} {'states':>9s}")
    for name in parity.FAMILIES:
        full, chunked, state = max_errors(name)
        print(f"{name:12s} {full:9.1e} {chunked:9.1e} {state:9.1e}", flush=True)


if __name__ == "__main__":
    main()
