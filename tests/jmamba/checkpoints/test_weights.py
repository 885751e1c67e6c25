"""Loader and config adapter: shards, bf16, and clear errors for bad checkpoints or configs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import load_file, save_file

from jmamba import HybridLM, from_hf_config, load_hf_config, load_pretrained
from jmamba.checkpoints.weights import save_pretrained
from jmamba.config import Ffn, Mixer
from jmamba.layer_configs import SharedBlockConfig

FIXTURES = Path(__file__).parents[2] / "fixtures"


def copy_fixture(tmp_path: Path, family: str) -> Path:
    target = tmp_path / family
    shutil.copytree(FIXTURES / family, target)
    (target / "expected.npz").unlink()
    return target


def params_of(model) -> dict:
    return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model))}


def test_sharded_checkpoint_loads_the_same_parameters(tmp_path):
    """Two shards plus an index give exactly the parameters of the single file."""
    target = copy_fixture(tmp_path, "qwen3_next")
    tensors = load_file(target / "model.safetensors")
    names = sorted(tensors)
    halves = {
        "model-00001-of-00002.safetensors": names[::2],
        "model-00002-of-00002.safetensors": names[1::2],
    }
    for file, part in halves.items():
        save_file({n: tensors[n] for n in part}, target / file)
    (target / "model.safetensors").unlink()
    index = {"weight_map": {n: f for f, part in halves.items() for n in part}}
    (target / "model.safetensors.index.json").write_text(json.dumps(index))
    sharded, single = (
        params_of(load_pretrained(target)),
        params_of(load_pretrained(FIXTURES / "qwen3_next")),
    )
    assert sharded.keys() == single.keys()
    assert all(np.array_equal(sharded[k], single[k]) for k in single)


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda t: t.pop("lm_head.weight"), r"missing tensors \['lm_head.weight'\]"),
        (lambda t: t.update(extra=np.zeros(3, np.float32)), r"unexpected tensors \['extra'\]"),
    ],
)
def test_missing_or_unexpected_tensors_are_listed(tmp_path, change, message):
    target = copy_fixture(tmp_path, "mamba2")
    tensors = load_file(target / "model.safetensors")
    change(tensors)
    save_file(tensors, target / "model.safetensors")
    with pytest.raises(ValueError, match=message):
        load_pretrained(target)


def test_missing_checkpoint_files_raise(tmp_path):
    target = copy_fixture(tmp_path, "mamba2")
    (target / "model.safetensors").unlink()
    with pytest.raises(ValueError, match="no model.safetensors"):
        load_pretrained(target)
    with pytest.raises(ValueError, match="no config.json"):
        load_pretrained(tmp_path / "nowhere")


def fixture_config(family: str) -> dict:
    return json.loads((FIXTURES / family / "config.json").read_text())


def test_layer_pattern_comes_from_the_config_fields():
    nemotron = from_hf_config(fixture_config("nemotron_h"))
    assert nemotron.mixers[:4] == (Mixer.MAMBA2, Mixer.NONE, Mixer.ATTENTION, Mixer.NONE)
    assert nemotron.ffns[:4] == (Ffn.NONE, Ffn.MLP, Ffn.NONE, Ffn.MOE)
    assert nemotron.mamba2.dt_limit[1] == float("inf")  # decoded from {"__float__": "Infinity"}
    qwen = from_hf_config(fixture_config("qwen3_next"))
    assert qwen.ffns == (Ffn.MOE, Ffn.MLP, Ffn.MOE, Ffn.MOE)  # mlp_only_layers=[1]
    assert qwen.attention.rotary_dim == 4 and qwen.norm_offset == 1.0


def test_falcon_h1_config_fields():
    """Every layer is attention beside Mamba2 plus an MLP; head_dim and mamba_d_ssm are read
    (falling back to hidden / heads and expand * hidden), mamba_rms_norm and
    mamba_norm_before_gate pick the gate norm, and the multipliers come along for the loader."""
    falcon = from_hf_config(fixture_config("falcon_h1"))
    assert falcon.mixers == (Mixer.PARALLEL_HYBRID,) * 2 and falcon.ffns == (Ffn.MLP,) * 2
    assert falcon.has_attention and falcon.has_recurrent_state and falcon.chunk_size == 16
    assert falcon.mamba2.d_inner == 128 and falcon.mamba2.gate_norm == "norm_then_gate"
    assert falcon.attention.rotary_dim == 16 and falcon.attention.rope_theta == 1000.0
    assert falcon.multipliers.mamba2_segments == (0.9, 1.1, 0.8, 1.2, 0.7)
    assert (falcon.multipliers.mlp_gate, falcon.multipliers.mlp_down) == (0.85, 1.15)
    # The embedding's and the head's multipliers scale activations, so a tied head can differ.
    assert (falcon.embedding_multiplier, falcon.logits_multiplier) == (1.7, 0.6)
    odd = from_hf_config(fixture_config("falcon_h1_odd"))
    assert odd.attention.head_dim == 20 and odd.mamba2.d_inner == 120  # not 12, not 144
    assert odd.mamba2.gate_norm == "gate_only"
    cfg = fixture_config("falcon_h1_odd")
    cfg.update(mamba_rms_norm=True, mamba_norm_before_gate=False, mamba_d_head="auto")
    del cfg["head_dim"]
    edited = from_hf_config(cfg)
    assert edited.mamba2.gate_norm == "gate_then_norm" and edited.mamba2.head_dim == 24
    assert edited.attention.head_dim == 12


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.update(projectors_bias=True), "projectors_bias=True is not supported"),
        (lambda c: c.update(mamba_proj_bias=True), "mamba_proj_bias=True is not supported"),
        (lambda c: c.update(hidden_act="gelu"), "hidden_act='gelu' is not supported"),
        (lambda c: c.update(mamba_d_head=16), r"mamba_n_heads\*mamba_d_head=80 must equal"),
        (lambda c: c.pop("mamba_d_ssm"), "missing the required 'mamba_d_ssm'"),
        (lambda c: c.update(ssm_multipliers=[1.0, 2.0]), "one multiplier per"),
        (lambda c: c.update(key_multiplier=0.0), "must be finite and non-zero"),
        (
            lambda c: c.update(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4}),
            "rope_type='yarn' is not supported",
        ),
    ],
)
def test_falcon_h1_configs_we_cannot_run_raise(edit, message):
    cfg = fixture_config("falcon_h1_odd")
    edit(cfg)
    with pytest.raises(ValueError, match=message):
        from_hf_config(cfg)


@pytest.mark.parametrize(
    "edit, message",
    [
        (lambda c: c.update(architectures=["LlamaForCausalLM"]), "architectures=.*not supported"),
        (lambda c: c.pop("vocab_size"), "missing the required field 'vocab_size'"),
        (
            lambda c: c.update(layers_block_type=["mamba", "rnn"]),
            r"unknown NemotronH layer types \['rnn'\]",
        ),
        (lambda c: c.update(n_routed_experts=3, n_group=2), "n_group=2 must divide num_experts=3"),
        (lambda c: c.update(eos_token_id=[2, 128]), r"eos_token_ids \[128\] are outside"),
        (lambda c: c.update(eos_token_id="2"), "eos_token_id='2' in config.json must be an int"),
    ],
)
def test_invalid_configs_raise_value_errors_naming_the_field(edit, message):
    cfg = fixture_config("nemotron_h")
    edit(cfg)
    with pytest.raises(ValueError, match=message):
        from_hf_config(cfg)


def test_eos_ids_of_config_and_generation_config_are_both_kept(tmp_path):
    """transformers' generate stops at generation_config.json's ids; config.json's stay too."""
    target = copy_fixture(tmp_path, "mamba2")  # config.json: eos_token_id 2
    assert load_hf_config(target).eos_token_ids == (2,)
    (target / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2, 9]}))
    assert load_hf_config(target).eos_token_ids == (2, 7, 9)
    (target / "generation_config.json").write_text(json.dumps({"eos_token_id": 5}))
    assert load_pretrained(target).config.eos_token_ids == (2, 5)
    (target / "generation_config.json").write_text(json.dumps({"eos_token_id": [1.5]}))
    with pytest.raises(ValueError, match="generation_config.json must be an int id"):
        load_hf_config(target)


@pytest.mark.parametrize(
    "name, content, message",
    [
        ("config.json", b'{"architectures": [', r"config.json is not valid JSON"),
        ("config.json", b"[1, 2]", r"config.json must hold a JSON object, not a list"),
        ("config.json", b"\xff\xfe", r"config.json is not valid JSON"),
        ("generation_config.json", b"eos=2", r"generation_config.json is not valid JSON"),
        ("model.safetensors.index.json", b"{", r"model.safetensors.index.json is not valid"),
        ("model.safetensors.index.json", b"{}", r"index.json has no 'weight_map'"),
    ],
)
def test_unreadable_json_files_are_named(tmp_path, name, content, message):
    target = copy_fixture(tmp_path, "mamba2")
    (target / name).write_bytes(content)
    with pytest.raises(ValueError, match=message) as error:
        load_pretrained(target)
    assert str(target / name) in str(error.value)  # the full path of the file


@pytest.mark.parametrize("keep", [0.5, 0.001, 0.0])
def test_truncated_safetensors_is_named(tmp_path, keep):
    """A download cut short: the loader names the file instead of the parser's bare error."""
    target = copy_fixture(tmp_path, "mamba2")
    path = target / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(ValueError, match="is not a readable safetensors file") as error:
        load_pretrained(target)
    assert str(path) in str(error.value)


def test_bamba_and_granite_fields():
    bamba = from_hf_config(fixture_config("bamba"))
    assert bamba.mixers == (Mixer.MAMBA2, Mixer.MAMBA2, Mixer.ATTENTION, Mixer.MAMBA2)
    assert bamba.ffns == (Ffn.MLP,) * 4 and bamba.attention.rotary_dim == 8  # half of 16
    assert bamba.attention.scale == 16**-0.5 and bamba.residual_multiplier == 1.0
    granite = from_hf_config(fixture_config("granite_h_odd"))
    assert granite.mixers == (Mixer.MAMBA2, Mixer.ATTENTION, Mixer.MAMBA2)
    assert granite.ffns == (Ffn.MOE,) * 3 and granite.attention.rotary_dim == 12  # whole head
    assert granite.attention.scale == 1 / 12 and granite.logits_multiplier == 1 / 3
    assert (granite.embedding_multiplier, granite.residual_multiplier) == (6.0, 0.3)
    assert from_hf_config(fixture_config("granite_h")).attention.rotary_dim == 0  # "nope"
    legacy = {**fixture_config("granite_h"), "layer_types": ["mamba", "attention"] * 2}
    assert from_hf_config(legacy).mixers == (Mixer.MAMBA2, Mixer.ATTENTION) * 2


def test_granite_without_experts_has_the_shared_mlp_alone(tmp_path):
    """num_local_experts 0: a dense SwiGLU MLP per layer, read from `shared_mlp` (gate | up
    fused in `input_linear`), written back the same way."""
    config = {**fixture_config("granite_h"), "num_local_experts": 0}
    model = HybridLM(from_hf_config(config), rngs=nnx.Rngs(0))
    assert model.config.ffns == (Ffn.MLP,) * 4 and model.config.mlp.intermediate_size == 32
    save_pretrained(model, tmp_path, config)
    tensors = load_file(tmp_path / "model.safetensors")
    assert not any("block_sparse_moe" in name for name in tensors)
    fused = tensors["model.layers.0.shared_mlp.input_linear.weight"]  # [gate | up] rows
    mlp = model.layers[0].ffn
    np.testing.assert_array_equal(fused[:32], np.asarray(mlp.gate_proj.kernel[...]).T)
    np.testing.assert_array_equal(fused[32:], np.asarray(mlp.up_proj.kernel[...]).T)
    reloaded = params_of(load_pretrained(tmp_path))
    assert all(np.array_equal(v, reloaded[k]) for k, v in params_of(model).items())


@pytest.mark.parametrize(
    "family, edit, message",
    [
        ("bamba", dict(attn_layer_indices=[2, 7]), r"attn_layer_indices \[7\] are outside"),
        ("bamba", dict(mlp_bias=True), "mlp_bias=True is not supported"),
        ("bamba", dict(mamba_proj_bias=True), "mamba_proj_bias=True is not supported"),
        ("bamba", dict(hidden_act="gelu"), "hidden_act='gelu' is not supported"),
        ("bamba", dict(partial_rotary_factor=1.0), "partial_rotary_factor=1.0 is not supported"),
        ("bamba", dict(mamba_d_head=12), "mamba_n_heads\\*mamba_d_head=96 must equal"),
        ("granite_h", dict(attention_bias=True), "attention_bias=True is not supported"),
        ("granite_h", dict(position_embedding_type="alibi"), "position_embedding_type='alibi'"),
        ("granite_h", dict(layer_types=["mamba"] * 3), "layer_types must list"),
        ("granite_h", dict(layer_types=["mamba", "rnn"] * 2), "layer_types must list"),
        ("granite_h", dict(logits_scaling=0), "logits_scaling=0 is not supported"),
        ("granite_h_odd", dict(rope_parameters={"rope_type": "yarn"}), "rope_type='yarn'"),
        (
            "granite_h_odd",
            dict(rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": 0.5}),
            "partial_rotary_factor=0.5 is not supported",
        ),
    ],
)
def test_unsupported_bamba_and_granite_options_are_refused(family, edit, message):
    with pytest.raises(ValueError, match=message):
        from_hf_config({**fixture_config(family), **edit})


def test_zamba2_config_fields():
    """Mamba2 and hybrid layers from `layers_block_type` (the legacy "mamba" name too); the shared
    blocks' attention on 2 x hidden, head_dim 2 x hidden / heads, softmax scale
    (head_dim / 2)^-1/2, RoPE only with `use_mem_rope`; the block's fields; the Mamba2 mixers'
    head_dim from mamba_expand x hidden / n_mamba_heads, dt clamped at time_step_min and the gated
    norm's eps 1e-5 whatever rms_norm_eps says; the head tied."""
    zamba = from_hf_config(fixture_config("zamba2"))
    m, h = Mixer.MAMBA2, Mixer.TRANSFORMER_MAMBA2
    assert zamba.mixers == (m, h, h, m, h, h) and zamba.ffns == (Ffn.NONE,) * 6
    assert zamba.has_attention and zamba.has_recurrent_state and zamba.chunk_size == 16
    assert zamba.attention.head_dim == 32 and zamba.attention.scale == 16**-0.5
    assert zamba.attention.rotary_dim == 0 and zamba.tie_word_embeddings
    assert zamba.shared_block == SharedBlockConfig(2, 128, 8, True, "gelu")
    assert zamba.mamba2.head_dim == 16 and zamba.mamba2.dt_limit == (0.001, float("inf"))
    odd = from_hf_config(fixture_config("zamba2_odd"))
    assert odd.mixers[:2] == (h, m) and odd.mamba2.n_groups == 1 and odd.mamba2.d_state == 12
    assert odd.attention.rotary_dim == 24 and odd.attention.rope_theta == 5000.0
    assert odd.norm_eps == 1e-6 and odd.mamba2.gate_norm_eps == 1e-5
    cfg = fixture_config("zamba2")
    del cfg["intermediate_size"]
    cfg.update(
        layers_block_type=["mamba", "hybrid"] * 3,
        use_shared_attention_adapter=False,
        num_key_value_heads=2,
        hidden_act="silu",
        use_long_context=True,
    )
    edited = from_hf_config(cfg)
    assert edited.mixers == (m, h) * 3 and edited.attention.num_kv_heads == 2
    assert edited.shared_block == SharedBlockConfig(2, 256, 8, False, "silu")  # 4 x hidden
    assert edited.max_position_embeddings == 16384


@pytest.mark.parametrize(
    "edit, message",
    [
        (dict(add_bias_linear=True), "add_bias_linear=True is not supported"),
        (dict(tie_word_embeddings=False), "tie_word_embeddings=False is not supported"),
        (dict(use_shared_mlp_adapter=False), "use_shared_mlp_adapter=False is not supported"),
        (dict(hidden_act="relu"), "hidden_act='relu' is not supported"),
        (dict(num_key_value_heads=2), "use_shared_attention_adapter needs num_key_value_heads=2"),
        (dict(num_attention_heads=6), "use_shared_attention_adapter needs .* dividing"),
        (dict(n_mamba_heads=5), "n_mamba_heads=5 must divide mamba_expand"),
        (dict(layers_block_type=["mamba", "attention"] * 3), "layers_block_type must list"),
        (dict(layers_block_type=["hybrid"] * 5), "layers_block_type must list"),
        (dict(layers_block_type=None), "missing 'layers_block_type'"),
        (dict(num_mem_blocks=0), "num_mem_blocks=0 must be >= 1"),
        (dict(use_mem_rope=True, rope_parameters={"rope_type": "yarn"}), "rope_type='yarn'"),
    ],
)
def test_zamba2_configs_we_cannot_run_raise(edit, message):
    cfg = {**fixture_config("zamba2"), **edit}
    with pytest.raises(ValueError, match=message):
        from_hf_config(cfg)
