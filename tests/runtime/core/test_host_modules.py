"""docs/architecture.md section 3: the runtime's host modules (all of `runtime/core/`, the prefix
cache, outputs and observe wings, the jax-free parts of the speculative wing) import no jax, flax
or Pallas kernels."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).parents[3]
# Every module of these wings is host-side; a new one is covered without being listed.
HOST_WINGS = ("runtime/core", "runtime/prefix_cache", "runtime/outputs", "runtime/observe")
HOST_MODULES = (
    *(
        ".".join(path.with_suffix("").relative_to(ROOT).parts)
        for wing in HOST_WINGS
        for path in sorted((ROOT / wing).glob("*.py"))
    ),
    "runtime.router",
    "runtime.speculative.ngram",
    "runtime.speculative.verify",
    "runtime.speculative.draft_sequences",
    "runtime.device.compile_cache",
    "jmamba.step.inputs",
    "jmamba.step.prefill",
    "jmamba.step.describe",
    "jmamba.step.invariants",
    "jmamba.config",
    "jmamba.checkpoints.families.registry",
)
DEVICE_PACKAGES = ("jax", "jaxlib", "flax", "pallas_kernels")


def test_host_modules_leave_jax_unloaded():
    """In a fresh interpreter: import every host module, build and validate a step."""
    script = f"""
import sys
for name in {HOST_MODULES!r}:
    __import__(name)
from runtime.core.buckets import BucketPolicy
from runtime.core.builder import build_step
from runtime.core.engine_args import EngineArgs
from runtime.core.request import Request
from runtime.core.sampling_params import SamplingParams
from runtime.core.scheduler import Scheduler
from runtime.prefix_cache import slot_planner
from jmamba.step.invariants import check_step_inputs
config = EngineArgs(max_num_batched_tokens=16, max_model_len=64, block_size=4).resolved(4)
scheduler = Scheduler(config, slot_planner(config, uses_blocks=True, uses_slots=True))
scheduler.add(Request("a", [1, 2, 3, 4, 5], SamplingParams(min_tokens=1), seed=0,
                      eos_token_ids=(2,)))
schedule = scheduler.schedule()
bucket = BucketPolicy(scheduler.config).bucket_for(schedule)
batch = build_step(schedule, bucket, block_size=4, max_blocks=16,
                   state_block_size=scheduler.config.boundary_block_size)
check_step_inputs(batch.inputs, block_size=4, chunk_size=4, num_blocks=scheduler.config.num_blocks,
                  published_slots=scheduler.slots.published_slots)
loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({DEVICE_PACKAGES!r}))
print(",".join(loaded) or "none")
"""
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "none"
