"""Section `fp8` of the GPU checks: FP8 checkpoints through the GPU's FP8 paths (issue 51).

Each case is a transformers fixture written as an FP8 checkpoint in a published layout by
tests/jmamba/quantization/fp8_writer.py, beside its dequantized twin (the same weights in fp32),
and loaded with no flag. On the GPU the FP8 model runs its dense projections through
`Fp8Linear`'s GPU product (the weight-only kernel where scales are blocked along K), its expert
stacks through `ops.fp8_grouped_matmul` (16-row blocks; 8-row ones fall back to the dequantizing
reference), and with an FP8 KV cache the checkpoint's k / v scales in the paged kernels; its
logits over one prefill of 39 tokens must match the twin's (plain weights, same kernels) within
1e-4 (fp32 fixtures: the FP8 products are exact products summed in fp32), or with an FP8 KV
cache against the twin's fp32 cache within 5% of the logits' spread (the cache's own rounding,
0.019 measured on the CPU). With two or more devices, the 16 x 16 block case is also served at
tensor_parallel_size=2 (e4m3 kernels split with their scales) against one device: greedy tokens
equal, log-probabilities within 1e-4. On a CPU (`quick`) the first case runs, with the
references.

    PYTHONPATH=. python benchmarks/gpu_checks.py --only fp8
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import jax
import numpy as np
from flax import nnx

from benchmarks.checks import Check, use_kernels
from jmamba.cache_dtypes import CacheDtypes
from jmamba.checkpoints.weights import load_pretrained
from jmamba.step.prefill import prefill_inputs
from tests.jmamba.quantization import fp8_writer as writer

BLOCK = 16
TOKENS = np.arange(1, 40) % 50
# name: (fixture, format, KV cache dtype)
CASES = {
    "qwen3_next 16x16 blocks": ("qwen3_next", writer.block_fp8(), "auto"),
    "qwen3_5_moe packed 16x16 experts": (
        "qwen3_5_moe",
        writer.block_fp8(packed_experts=True),
        "auto",
    ),
    "qwen3_5_moe_odd packed 8x8 experts": (
        "qwen3_5_moe_odd",
        writer.block_fp8(8, 8, packed_experts=True),
        "auto",
    ),
    "nemotron_h per channel": ("nemotron_h", writer.compressed_tensors("channel"), "auto"),
    "nemotron_h modelopt, FP8 KV cache": ("nemotron_h", writer.modelopt(), "fp8"),
}
LOGITS_TOL, KV_SPREAD = 1e-4, 0.05


def _logits(model_dir: Path, kv_cache: str) -> np.ndarray:
    model = load_pretrained(model_dir)
    caches = model.init_caches(
        num_blocks=1 + -(-TOKENS.size // BLOCK),
        block_size=BLOCK,
        num_slots=2,
        dtypes=CacheDtypes(kv_cache),
    )
    inputs = prefill_inputs(TOKENS, block_size=BLOCK, all_logits=True)
    graphdef, state = nnx.split(model)
    step = jax.jit(lambda s, c: nnx.merge(graphdef, s)(inputs, c)[0])
    return np.asarray(step(state, caches))


def check_case(name: str, root: Path) -> Check:
    """One case's FP8 logits against its dequantized twin's."""
    start = time.perf_counter()
    family, fmt, kv_cache = CASES[name]
    fp8, reference = writer.write_pair(family, fmt, root / name.replace(" ", "_"))
    ours, theirs = _logits(fp8, kv_cache), _logits(reference, "auto")
    error = float(np.abs(ours - theirs).max())
    tol = LOGITS_TOL if kv_cache == "auto" else KV_SPREAD * float(theirs.std())
    detail = f"max|d logit| {error:.1e} (tol {tol:.1e}, {time.perf_counter() - start:.0f} s)"
    return Check(f"fp8 {name}", bool(error <= tol), detail)


def check_tensor_parallel(root: Path) -> Check:
    """The 16 x 16 block case served over two devices against one."""
    from runtime import LLM, SamplingParams

    start = time.perf_counter()
    fp8, _ = writer.write_pair("qwen3_next", writer.block_fp8(), root / "tp")
    served = []
    for tp in (1, 2):
        llm = LLM(str(fp8), max_num_seqs=2, max_model_len=64, tensor_parallel_size=tp)
        params = SamplingParams(max_tokens=8, logprobs=1)
        (out,) = llm.generate([[28, 126, 52, 42, 82, 7]], params, use_tqdm=False)
        served.append((out.token_ids, [max(step.values()) for step in out.logprobs]))
    (tokens_one, logprobs_one), (tokens, logprobs) = served
    delta = float(np.abs(np.subtract(logprobs_one, logprobs)).max())
    same = tokens == tokens_one
    detail = f"tokens {'equal' if same else 'DIFFER'}, max|d logprob| {delta:.1e}"
    ok = same and delta <= LOGITS_TOL
    return Check("fp8 qwen3_next 16x16 tp=2", ok, f"{detail} ({time.perf_counter() - start:.0f} s)")


def run(quick: bool, families: list[str] | None = None) -> list[Check]:
    """Every case (the first when `quick`); the tensor-parallel one with >= 2 devices."""
    del families
    use_kernels()
    checks = []
    with tempfile.TemporaryDirectory() as directory:
        root = Path(directory)
        for name in list(CASES)[:1] if quick else CASES:
            try:
                checks.append(check_case(name, root))
            except Exception as error:  # one failed case; the others still run
                checks.append(Check(f"fp8 {name}", False, f"raised {error!r}"))
        if not quick and len(jax.devices()) >= 2:
            checks.append(check_tensor_parallel(root))
    return checks
