"""Parameter dtypes by role: a bf16 model has bf16 matmul weights and fp32 everything fp32 math
reads, and its decode step does no work on parameters (no convert, no -exp(A_log))."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from jmamba import load_pretrained
from jmamba.checkpoints.weights import cast, save_pretrained
from jmamba.mixers.mamba2 import a_from_log, log_from_a
from tests.jmamba.steps import Row, build

FIXTURES = Path(__file__).parents[1] / "fixtures"
FAMILIES = sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").is_file())

# Written out here, apart from the `Fp32Param` declarations they check: the parameters fp32 math
# reads, by their path in the model.
FP32_LEAVES = {"A", "A_log", "D", "dt_bias", "conv_weight", "conv_bias", "router_bias"}
NORMS = {
    "mixer_norm",
    "ffn_norm",
    "final_norm",
    "norm",
    "q_norm",
    "k_norm",
    "block_norm",
    "mamba_norm",
    "embedding_norm",  # the MTP head's (jmamba.mtp)
    "hidden_norm",
}


def wants_fp32(path: tuple) -> bool:
    return (
        path[-1] in FP32_LEAVES
        or (path[-1] == "weight" and path[-2] in NORMS)
        or path[-2:] == ("router", "kernel")
    )


def params_of(model) -> dict:
    return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model))}


@pytest.mark.parametrize("family", FAMILIES)
def test_bf16_load_keeps_fp32_math_parameters_in_fp32(family):
    full = params_of(load_pretrained(FIXTURES / family, dtype="float32"))
    half = params_of(load_pretrained(FIXTURES / family, dtype=jnp.bfloat16))
    assert half.keys() == full.keys()
    assert any(wants_fp32(p) for p in half) and not all(wants_fp32(p) for p in half)
    for path, value in half.items():
        if wants_fp32(path):  # not rounded through bf16
            assert value.dtype == np.float32, path
            np.testing.assert_array_equal(value, full[path], err_msg=str(path))
        else:
            assert value.dtype == jnp.bfloat16, path
            np.testing.assert_array_equal(value, full[path].astype(jnp.bfloat16), str(path))


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_next"])
def test_cast_gives_the_dtypes_and_values_of_a_bf16_load(family):
    loaded = params_of(load_pretrained(FIXTURES / family, dtype="bfloat16"))
    casted = params_of(cast(load_pretrained(FIXTURES / family), "bfloat16"))
    for path, value in loaded.items():
        assert casted[path].dtype == value.dtype, path
        np.testing.assert_array_equal(casted[path], value, err_msg=str(path))
    back = params_of(cast(cast(load_pretrained(FIXTURES / family), "bfloat16"), "float32"))
    assert {v.dtype for v in back.values()} == {np.dtype(np.float32)}


@pytest.mark.parametrize("family", ["mamba2", "nemotron_h_odd", "qwen3_5_moe"])
def test_bf16_model_round_trips_bit_for_bit(tmp_path, family):
    model = load_pretrained(FIXTURES / family, dtype="bfloat16")
    save_pretrained(model, tmp_path, json.loads((FIXTURES / family / "config.json").read_text()))
    for dtype in ("auto", "bfloat16"):
        again = params_of(load_pretrained(tmp_path, dtype=dtype))
        for path, value in params_of(model).items():
            assert again[path].dtype == value.dtype, path
            np.testing.assert_array_equal(again[path], value, err_msg=str(path))


def test_a_from_log_against_float64_and_back():
    rng = np.random.default_rng(0)
    a_log = np.concatenate(
        [rng.uniform(-1, 1, 20000), rng.uniform(-9, 9, 20000), np.log(np.arange(1, 129))]
    ).astype(np.float32)
    a = a_from_log(a_log)
    exact = -np.exp(a_log.astype(np.float64))
    # Rounded once: within half an fp32 ulp of the float64 value.
    assert np.all(np.abs(a - exact) <= np.spacing(np.abs(a)) / 2 * (1 + 1e-9))
    back = log_from_a(a)
    np.testing.assert_array_equal(a_from_log(back), a)  # the model's A comes back exactly
    # The checkpoint's A_log, or another of the same A (they lie 2^-24 relative apart in A).
    np.testing.assert_allclose(back, a_log, rtol=0, atol=2.0**-23)
    bf16 = a_log.astype(jnp.bfloat16)  # a bf16 checkpoint's A_log
    np.testing.assert_array_equal(a_from_log(log_from_a(a_from_log(bf16))), a_from_log(bf16))


# Layout ops pass a parameter through unchanged; anything else makes a new value.
_LAYOUT = {
    "reshape",
    "squeeze",
    "expand_dims",
    "broadcast_in_dim",
    "transpose",
    "slice",
    "dynamic_slice",
    "copy",
    "copy_p",
}
_WORK = {"convert_element_type", "exp", "neg"}


def _sub_jaxprs(eqn) -> list[tuple[jax.extend.core.Jaxpr, list]]:
    """(inner jaxpr, the outer vars its invars are bound to) of a call-like equation."""
    found = []
    for value in eqn.params.values():
        for inner in value if isinstance(value, tuple) else (value,):
            jaxpr = getattr(inner, "jaxpr", inner)
            if not isinstance(jaxpr, jax.extend.core.Jaxpr):
                continue
            if len(jaxpr.invars) == len(eqn.invars):
                found.append((jaxpr, eqn.invars))
            elif len(jaxpr.invars) == len(eqn.invars) - 1:  # cond: the index comes first
                found.append((jaxpr, eqn.invars[1:]))
    return found


def parameter_work(jaxpr, params: set) -> list[str]:
    """Equations of `jaxpr` (and the calls inside it) that convert, exponentiate or negate a
    parameter. Pallas kernels are not entered: what a kernel does with a parameter it does in
    registers."""
    params, found = set(params), []
    for eqn in jaxpr.eqns:
        inputs = [v for v in eqn.invars if isinstance(v, jax.extend.core.Var) and v in params]
        if not inputs:
            continue
        name = eqn.primitive.name
        if name in _LAYOUT:
            params.update(eqn.outvars)
        elif name in _WORK:
            found.append(f"{name} of {inputs[0].aval}")
        elif name != "pallas_call":
            for inner, outer in _sub_jaxprs(eqn):
                bound = {i for i, o in zip(inner.invars, outer, strict=True) if o in params}
                found += parameter_work(inner, bound)
    return found


@pytest.mark.parametrize("family", ["nemotron_h", "qwen3_next", "qwen3_5_moe"])
def test_bf16_decode_step_does_no_work_on_parameters(family, monkeypatch):
    monkeypatch.setenv("JMAMBA_KERNELS", "interpret")  # trace the GPU step: kernels, not references
    model = load_pretrained(FIXTURES / family, dtype="bfloat16")
    caches = model.init_caches(num_blocks=9, block_size=4, num_slots=4)
    rows = [Row([3], 5, 1, 2, [1, 2]), Row([7], 2, 3, 3, [3])]
    inputs = jax.tree.map(jnp.asarray, build(rows, [], block_size=4, max_blocks=2))
    graphdef, state = nnx.split(model)
    step = lambda p, c, i: nnx.merge(graphdef, p)(i, c)  # noqa: E731
    closed = jax.make_jaxpr(step)(state, caches, inputs)
    num_params = len(jax.tree.leaves(state))
    assert parameter_work(closed.jaxpr, set(closed.jaxpr.invars[:num_params])) == []
    # The check can fail: an all-bf16 model (every parameter cast) converts its norm weights.
    all_bf16 = jax.tree.map(lambda a: a.astype(jnp.bfloat16), state)
    closed = jax.make_jaxpr(step)(all_bf16, caches, inputs)
    work = parameter_work(closed.jaxpr, set(closed.jaxpr.invars[:num_params]))
    assert any(w.startswith("convert") for w in work)
