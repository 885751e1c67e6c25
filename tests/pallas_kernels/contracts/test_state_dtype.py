"""Recurrent state pools in bf16 (`EngineArgs.state_dtype="bfloat16"`): every op that reads and
writes a Mamba2 SSM or Gated DeltaNet recurrent pool takes it in the dtype it is given, reads it
as fp32, accumulates in fp32 and stores in bf16.

The NULL-contract cases (test_null_contract.py) are rerun with their pool cast to bf16: the new
pool is bf16, the kernel (interpret) matches the reference given the same bf16 pool to within a
bf16 rounding of the state (fp32 sums in another order may round the other way), and both stay
within bf16 rounding of the fp32 pool's run; slot 0, poisoned, stays bit-identical.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tests.pallas_kernels.contracts.test_null_contract import CASES

# The cases whose pool is a recurrent state (the others hold conv windows, in the model's dtype).
RECURRENT = (
    "gdn_chunk",
    "gdn_decode",
    "gdn_state_update",
    "mamba2_decode",
    "ssd_chunk_scan",
    "ssd_state_update",
)
BF16 = np.dtype(ml_dtypes.bfloat16)


def _run(case, pool: np.ndarray, implementation: str) -> tuple[np.ndarray, np.ndarray]:
    out, new_pool = case.run(pool, implementation)
    assert new_pool.dtype == pool.dtype, f"{implementation} stored the pool as {new_pool.dtype}"
    return np.asarray(out, np.float32), np.asarray(new_pool, np.float32)


def _close(actual: np.ndarray, expected: np.ndarray, ulps: float) -> None:
    """Within `ulps` bf16 roundings of each value's magnitude (2^-8 relative each)."""
    bound = ulps * 2.0**-8 * (np.abs(expected) + np.abs(expected).max() * 1e-2)
    assert np.all(np.abs(actual - expected) <= bound), np.abs(actual - expected).max()


@pytest.mark.parametrize("name", RECURRENT)
def test_bf16_state_pool_is_read_and_written_as_bf16(name: str):
    case = CASES[name]()
    pool = case.pool.astype(BF16)
    pool[0] = np.nan
    fp32_out, fp32_pool = _run(case, pool.astype(np.float32), "reference")
    ref_out, ref_pool = _run(case, pool, "reference")
    out, new_pool = _run(case, pool.copy(), "interpret")
    assert np.isnan(new_pool[0]).all() and np.isnan(ref_pool[0]).all()  # slot 0 untouched
    _close(new_pool[1:], ref_pool[1:], ulps=1)
    _close(ref_pool[1:], fp32_pool[1:], ulps=1)
    live = ~case.padding
    np.testing.assert_allclose(out[live], ref_out[live], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ref_out[live], fp32_out[live], rtol=1e-4, atol=1e-5)
