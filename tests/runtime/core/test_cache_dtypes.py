"""The cache dtype options (`EngineArgs.kv_cache_dtype`, `state_dtype`; `jmamba.cache_dtypes`):
bad names refused with a ValueError naming the argument and what it allows, the alias resolved
once, and what each name stores (no jax, no device)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from jmamba.cache_dtypes import CacheDtypes
from runtime.core.engine_args import EngineArgs


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(kv_cache_dtype="fp16"), r"kv_cache_dtype='fp16' must be one of \('auto', 'fp8', "),
        (dict(kv_cache_dtype="FP8"), "kv_cache_dtype='FP8' must be one of"),
        (dict(kv_cache_dtype=None), "kv_cache_dtype=None must be one of"),
        (dict(state_dtype="float16"), r"state_dtype='float16' must be one of \('float32', 'bf"),
        (dict(state_dtype="bf16"), "state_dtype='bf16' must be one of"),
    ],
)
def test_bad_cache_dtypes_are_refused_by_name(options, message):
    with pytest.raises(ValueError, match=message):
        EngineArgs(**options)


def test_the_fp8_alias_resolves_once_and_the_defaults_are_todays_dtypes():
    config = EngineArgs(kv_cache_dtype="fp8_e4m3", state_dtype="bfloat16").resolved(8)
    assert (config.kv_cache_dtype, config.state_dtype) == ("fp8", "bfloat16")
    assert config.cache_dtypes == CacheDtypes("fp8", "bfloat16")
    assert EngineArgs.of_config(config).resolved(8) == config
    default = EngineArgs().resolved(8).cache_dtypes
    assert default.kv_dtype(ml_dtypes.bfloat16) == np.dtype(ml_dtypes.bfloat16)  # "auto"
    assert default.kv_dtype(np.float32) == np.float32 and default.state_dtype == np.float32
    assert config.cache_dtypes.kv_dtype(np.float32) == np.dtype(ml_dtypes.float8_e4m3fn)
    assert config.cache_dtypes.state_dtype == np.dtype(ml_dtypes.bfloat16)
    assert default.describe() == "kv_cache_dtype=auto, state_dtype=float32"


def test_engines_with_other_cache_dtypes_may_not_share_a_runner():
    ours = EngineArgs().resolved(8)
    theirs = EngineArgs(kv_cache_dtype="fp8").resolved(8)
    with pytest.raises(ValueError, match="kv_cache_dtype=auto differs from the shared runner's"):
        ours.check_same_shapes(theirs, "the shared runner")
    with pytest.raises(ValueError, match="kv_cache=.fp8_e4m3.: use CacheDtypes.of"):
        CacheDtypes("fp8_e4m3")
