"""`save_pretrained` is the exact inverse of `load_pretrained`, for every family and preset."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file

import jmamba
from jmamba import from_hf_config, load_pretrained
from jmamba.checkpoint_tensors import skipped_tensors, unpack_experts
from jmamba.config import WeightMultipliers
from jmamba.mixers.mamba2 import a_from_log
from jmamba.weights import save_pretrained

FIXTURES = Path(__file__).parents[1] / "fixtures"
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
    the reload). Of a published Qwen3.5 checkpoint (`*_vl`) it writes the text model's tensors,
    its packed experts one tensor each (as transformers' `save_pretrained` writes them)."""
    config = json.loads((FIXTURES / family / "config.json").read_text())
    folded = from_hf_config(config).multipliers != WeightMultipliers()
    model = load_pretrained(FIXTURES / family)
    save_pretrained(model, tmp_path, config)
    original, written = (load_file(d / "model.safetensors") for d in (FIXTURES / family, tmp_path))
    if config.get("tie_word_embeddings"):
        original.pop("lm_head.weight", None)  # transformers may store the tied copy
    for names in skipped_tensors(model.config.architecture, original).values():
        for name in names:
            del original[name]
    original = unpack_experts(original)
    assert sorted(written) == sorted(original)
    for name, tensor in original.items():
        if name.endswith(("mixer.A_log", "mamba.A_log")):  # Mamba2 (GDN holds A_log itself)
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
