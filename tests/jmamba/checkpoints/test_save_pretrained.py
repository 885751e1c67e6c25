"""`save_pretrained` is the exact inverse of `load_pretrained`, for every family and preset."""

from __future__ import annotations

import json
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

import jmamba
from jmamba import from_hf_config, load_pretrained
from jmamba.checkpoints.name_map import tensor_sources
from jmamba.checkpoints.skipped_tensors import skipped_tensors, unpack_experts
from jmamba.checkpoints.weights import save_pretrained
from jmamba.mixers.mamba2 import a_from_log
from jmamba.multipliers import WeightMultipliers

FIXTURES = Path(__file__).parents[2] / "fixtures"
FAMILIES = sorted(p.name for p in FIXTURES.iterdir() if (p / "config.json").is_file())


def params_of(model) -> dict:
    return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model))}


def assert_same_params(a, b) -> None:
    pa, pb = params_of(a), params_of(b)
    assert pa.keys() == pb.keys()
    for key in pa:
        assert pa[key].dtype == pb[key].dtype, key
        np.testing.assert_array_equal(pa[key], pb[key], err_msg=str(key))


@pytest.mark.parametrize("family", FAMILIES)
def test_fixture_written_back_has_transformers_tensors(tmp_path, family):
    """The written file holds exactly the tensors transformers wrote (names, shapes, values), but
    for Mamba2's A_log: the model holds A = -exp(A_log), and fp32 A_log values 2^-24 apart can
    give the same A, so the written A_log is one that gives the same A as the original. Likewise
    a weight with a multiplier folded in (Falcon-H1): neighbouring fp32 values may fold to one
    parameter, so the written one may be the original's neighbour (same parameter, checked by
    the reload). A Zamba2 shared kernel with LoRA adapters folded into each use site's copy comes
    back as a kernel that folds to every use site's parameter bit for bit (the reload), which is
    the checkpoint's own or lies within one step of the folded parameter's dtype of it (where
    |B A| >> |W| several kernels fold to the same parameters). Of a published Qwen3.5 checkpoint
    (`*_vl`) it writes the text model's tensors, its packed experts one tensor each (as
    transformers' `save_pretrained` writes them)."""
    config = json.loads((FIXTURES / family / "config.json").read_text())
    folded = from_hf_config(config).multipliers != WeightMultipliers()
    model = load_pretrained(FIXTURES / family)
    save_pretrained(model, tmp_path, config)
    original, written = (load_file(d / "model.safetensors") for d in (FIXTURES / family, tmp_path))
    if config.get("tie_word_embeddings"):
        original.pop("lm_head.weight", None)  # transformers may store the tied copy
    for names in skipped_tensors(
        model.config.architecture, original, has_mtp=model.config.has_mtp
    ).values():
        for name in names:
            del original[name]
    original = unpack_experts(original)
    assert sorted(written) == sorted(original)
    params = params_of(model)
    adapted = {s.names[0]: params[p].T for p, s in tensor_sources(model.config).items() if s.joint}
    for name, tensor in original.items():
        if name in adapted:  # Zamba2: a use site's parameter, the kernel + its adapter
            step = np.spacing(np.abs(adapted[name]))
            assert np.all(np.abs(written[name] - tensor) <= step), name
        elif name.endswith(("mixer.A_log", "mamba.A_log")):  # Mamba2 (GDN holds A_log itself)
            assert written[name].dtype == tensor.dtype, name
            np.testing.assert_array_equal(a_from_log(written[name]), a_from_log(tensor), name)
            np.testing.assert_allclose(written[name], tensor, rtol=0, atol=2.0**-23)
        elif folded:
            np.testing.assert_array_max_ulp(written[name], tensor, maxulp=1)
        else:
            np.testing.assert_array_equal(written[name], tensor, err_msg=name)
    assert json.loads((tmp_path / "config.json").read_text()) == config
    assert_same_params(load_pretrained(tmp_path), model)


@pytest.mark.parametrize("name", jmamba.presets.names())
def test_preset_round_trips(tmp_path, name):
    config = jmamba.presets.hf_config(name)
    if name in jmamba.presets.trained_names():
        model = load_pretrained(jmamba.presets.path(name))
    else:
        model = jmamba.HybridLM(jmamba.presets.tiny(name), rngs=nnx.Rngs(3))
    save_pretrained(model, tmp_path, config)
    assert_same_params(load_pretrained(tmp_path), model)


def test_config_must_describe_the_model(tmp_path):
    model = jmamba.HybridLM(jmamba.presets.tiny("mamba2"), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="hf_config describes"):
        save_pretrained(model, tmp_path, jmamba.presets.hf_config("nemotron_h"))


def test_tied_embeddings_write_no_lm_head(tmp_path):
    config = {**jmamba.presets.hf_config("mamba2"), "tie_word_embeddings": True}
    model = jmamba.HybridLM(jmamba.from_hf_config(config), rngs=nnx.Rngs(1))
    save_pretrained(model, tmp_path, config)
    assert "lm_head.weight" not in load_file(tmp_path / "model.safetensors")
    assert_same_params(load_pretrained(tmp_path), model)


def zamba2_with_random_adapters(config: dict) -> jmamba.HybridLM:
    """A fresh Zamba2 model (each use site of a shared block initialised on its own) with random
    adapters."""
    model = jmamba.HybridLM(from_hf_config(config), rngs=nnx.Rngs(0))
    rng = np.random.default_rng(0)
    for path, variable in nnx.to_flat_state(nnx.state(model)):
        if "adapter" in str(path):
            shape = variable.get_value().shape
            variable.set_value(jnp.asarray(rng.normal(0.0, 0.1, shape), jnp.float32))
    return model


@pytest.mark.parametrize(
    "edit", [{}, {"use_shared_attention_adapter": False, "num_key_value_heads": 2}]
)
def test_zamba2_use_sites_that_differ_are_written_from_the_first(tmp_path, edit):
    """A fresh model's use sites of one shared block hold different kernels, none of them the fold
    of a checkpoint's, so no one shared kernel fits them all: the writer writes each block from
    its first use site, the kernel nearest to its parameter minus its adapter. Read back, the
    first use sites' (layers 1, 2) adapted kernels are within a step or two of their dtype of the
    model's, the later sites' (4, 5) block copies of the first ones', with their own adapters
    folded in; every other parameter is the model's. Written and read again, nothing moves."""
    config = {**json.loads((FIXTURES / "zamba2" / "config.json").read_text()), **edit}
    model = zamba2_with_random_adapters(config)
    save_pretrained(model, tmp_path / "once", config)
    once = load_pretrained(tmp_path / "once")
    ours, theirs = params_of(model), params_of(once)
    adapted = {"gate_up_proj"} | (
        {"q_proj", "k_proj", "v_proj"} if model.config.shared_block.attention_adapters else set()
    )
    for path, value in ours.items():
        layer, part = (path[1], path[3]) if path[0] == "layers" and len(path) > 3 else (None, None)
        if layer in (4, 5) and part in ("block_norm", "attention", "ffn_norm", "mlp"):
            first = theirs[("layers", layer - 3, *path[2:])]  # blocks: 1 at 1 and 4, 2 at 2 and 5
            same_as_first = path[-2] not in adapted  # the adapted ones fold their own adapter
            assert np.array_equal(theirs[path], first) == same_as_first, path
        elif layer in (1, 2) and path[-2] in adapted:
            np.testing.assert_allclose(theirs[path], value, rtol=0, atol=2e-7, err_msg=str(path))
        else:  # every other parameter, adapters included
            np.testing.assert_array_equal(theirs[path], value, err_msg=str(path))
    save_pretrained(once, tmp_path / "twice", config)
    assert_same_params(load_pretrained(tmp_path / "twice"), once)


def test_zamba2_bfloat16_checkpoint_round_trips(tmp_path):
    """A bf16 checkpoint read as bf16 (as the published ones are) is written back on the bf16 grid
    so that each use site's fold (in fp32, rounded to bf16) gives its parameter back. (A model
    cast to bf16 after loading in fp32 has its adapters rounded after the fold: no bf16 shared
    kernel need fit every use site, and the later sites may come back a bf16 step away.)"""
    config = json.loads((FIXTURES / "zamba2_odd" / "config.json").read_text())
    tensors = load_file(FIXTURES / "zamba2_odd" / "model.safetensors")
    (tmp_path / "bf16").mkdir()
    (tmp_path / "bf16" / "config.json").write_text(json.dumps(config))
    bf16 = {name: t.astype(ml_dtypes.bfloat16) for name, t in tensors.items()}
    save_file(bf16, tmp_path / "bf16" / "model.safetensors", metadata={"format": "pt"})
    model = load_pretrained(tmp_path / "bf16")
    assert model.dtype == jnp.bfloat16
    save_pretrained(model, tmp_path / "written", config)
    assert_same_params(load_pretrained(tmp_path / "written"), model)
