"""docs/architecture.md section 3: the runtime's host modules import no jax, flax or Pallas
kernels."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

HOST_MODULES = (
    "runtime.scheduler",
    "runtime.schedule",
    "runtime.row_slots",
    "runtime.step_stats",
    "runtime.introspection",
    "runtime.pools",
    "runtime.prefix_cache",
    "runtime.request",
    "runtime.buckets",
    "runtime.builder",
    "runtime.sampling_params",
    "runtime.sampling_inputs",
    "runtime.config",
    "runtime.checks",
    "runtime.detokenizer",
    "runtime.outputs",
    "runtime.step_record",
    "runtime.describe",
    "runtime.compile_cache",
    "jmamba.step_inputs",
    "jmamba.prefill",
    "jmamba.describe",
    "jmamba.invariants",
    "jmamba.config",
    "jmamba.families",
)
DEVICE_PACKAGES = ("jax", "jaxlib", "flax", "pallas_kernels")


def test_host_modules_leave_jax_unloaded():
    """In a fresh interpreter: import every host module, build and validate a step."""
    script = f"""
import sys
for name in {HOST_MODULES!r}:
    __import__(name)
from runtime.buckets import BucketPolicy
from runtime.builder import build_step
from runtime.config import EngineConfig
from runtime.request import Request
from runtime.sampling_params import SamplingParams
from runtime.scheduler import Scheduler
scheduler = Scheduler(EngineConfig(max_num_batched_tokens=16, max_model_len=64, block_size=4), 4,
                      uses_blocks=True, uses_slots=True)
scheduler.add(Request("a", [1, 2, 3, 4, 5], SamplingParams(min_tokens=1), seed=0,
                      eos_token_ids=(2,)))
schedule = scheduler.schedule()
bucket = BucketPolicy(scheduler.config).bucket_for(schedule)
batch = build_step(schedule, bucket, block_size=4, max_blocks=16,
                   state_block_size=scheduler.config.boundary_block_size)
batch.inputs.validate(block_size=4, chunk_size=4, num_blocks=scheduler.config.num_blocks,
                      published_slots=scheduler.prefix_cache.published_slots)
loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({DEVICE_PACKAGES!r}))
print(",".join(loaded) or "none")
"""
    root = Path(__file__).parents[2]
    result = subprocess.run([sys.executable, "-c", script], cwd=root, capture_output=True,
                            text=True, env={"PYTHONPATH": str(root)}, check=False)  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "none"
