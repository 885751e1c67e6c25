"""The README's path for a downloaded checkpoint directory, on the transformers fixtures of every
supported architecture: `LLM(directory)` and `jmamba generate --model directory` load it, the
first greedy token is the argmax of transformers' logits, and dtype "auto" follows the weights.
Falcon-H1, whose layers hold both KV blocks and a state, also runs from a prefix-cache hit; Bamba,
Granite-4.0-H and Zamba2 decode greedily through the engine.
A hub id (`--model org/name`) loads from huggingface_hub's cache (offline, laid out by
tests/jmamba/checkpoints/hub_cache.py)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from jmamba import checkpoint_dtype
from runtime.cli import main
from runtime.core.sampling_params import SamplingParams
from runtime.llm import LLM
from tests.jmamba.checkpoints.hub_cache import add_fixture
from tests.tiers import quick_first

FIXTURES = Path(__file__).parents[2] / "fixtures"
# One fixture per architecture; `*_vl` are Qwen3.5 as published (the multimodal wrappers).
ARCHITECTURES = (
    "mamba2",
    "nemotron_h",
    "qwen3_next",
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3_5_vl",
    "qwen3_5_moe_vl",
)
PROMPT_LEN = 19
GREEDY_TOKENS = 10


@pytest.mark.parametrize("name", quick_first(ARCHITECTURES))
def test_checkpoint_directory_generates_transformers_greedy_token(name):
    expected = np.load(FIXTURES / name / "expected.npz")
    prompt = expected["seq_a"][:PROMPT_LEN].tolist()
    llm = LLM(str(FIXTURES / name), max_num_seqs=2, max_model_len=64)
    assert llm.model.dtype == jnp.float32 and llm.tokenizer is None  # fixtures: fp32, no tokenizer
    (output,) = llm.generate(
        [prompt], SamplingParams(max_tokens=1, ignore_eos=True), use_tqdm=False
    )
    assert output.token_ids == [int(np.argmax(expected["logits_full_a"][PROMPT_LEN - 1]))]


def test_falcon_h1_prefill_after_a_prefix_hit_is_transformers():
    """Falcon-H1 through the engine with the prefix cache: each layer holds KV blocks and a
    Mamba2 state, and a hit needs both. A 44-token prompt after a 40-token one starts after the
    cached 32 (the state block: lcm of block 16 and chunk 32); each first token and its logprob
    are transformers'. One compiled step shape (prefill only), so a few seconds."""
    expected = np.load(FIXTURES / "falcon_h1_odd" / "expected.npz")
    seq_a = expected["seq_a"].tolist()
    llm = LLM(
        str(FIXTURES / "falcon_h1_odd"),
        max_num_seqs=1,
        max_model_len=64,
        max_num_batched_tokens=64,
        prefill_token_buckets=(64,),
        prefix_caching="all",
        validate_inputs=True,
    )
    params = SamplingParams(max_tokens=1, ignore_eos=True, logprobs=0)
    for length in (40, 44):
        (output,) = llm.generate([seq_a[:length]], params, use_tqdm=False)
        logits = expected["logits_full_a"][length - 1].astype(np.float64)
        token = int(np.argmax(logits))
        log_prob = logits[token] - logits.max() - np.log(np.exp(logits - logits.max()).sum())
        assert output.token_ids == [token]
        assert abs(output.logprobs[0][token] - log_prob) < 1e-4
    stats = llm.prefix_cache_stats
    assert (stats.hits, stats.hit_tokens) == (1, 32)


@pytest.mark.parametrize("name", quick_first(["bamba_odd", "granite_h_odd", "zamba2_odd"]))
def test_engine_decode_agrees_with_transformers_and_a_fresh_prefill(name):
    """Greedy decoding through the engine (prefill, then decode steps on the state pools): the
    first token is transformers' argmax, and a later token and its top logprobs are those of a
    fresh prefill over the prompt and the tokens before it."""
    expected = np.load(FIXTURES / name / "expected.npz")
    prompt = expected["seq_a"][:PROMPT_LEN].tolist()
    llm = LLM(str(FIXTURES / name), max_num_seqs=3, max_model_len=64)
    params = SamplingParams(max_tokens=GREEDY_TOKENS, ignore_eos=True, logprobs=3)
    (greedy,) = llm.generate([prompt], params, use_tqdm=False)
    assert greedy.token_ids[0] == int(np.argmax(expected["logits_full_a"][PROMPT_LEN - 1]))
    cuts = (4, GREEDY_TOKENS - 1)
    fresh = llm.generate(
        [prompt + greedy.token_ids[:k] for k in cuts],
        dataclasses.replace(params, max_tokens=1),
        use_tqdm=False,
    )
    for k, out in zip(cuts, fresh, strict=True):
        assert out.token_ids == [greedy.token_ids[k]]
        decoded, prefilled = greedy.logprobs[k], out.logprobs[0]
        assert decoded.keys() == prefilled.keys()
        assert all(abs(decoded[t] - prefilled[t]) < 1e-4 for t in decoded)


def bf16_copy(tmp_path: Path, name: str) -> Path:
    """The fixture with every tensor stored as bfloat16, as many downloaded checkpoints are."""
    target = tmp_path / name
    shutil.copytree(FIXTURES / name, target, ignore=shutil.ignore_patterns("expected.npz"))
    tensors = load_file(target / "model.safetensors")
    save_file(
        {k: v.astype(ml_dtypes.bfloat16) for k, v in tensors.items()},
        target / "model.safetensors",
        metadata={"format": "pt"},
    )
    return target


def test_auto_dtype_is_the_checkpoints(tmp_path):
    bf16 = bf16_copy(tmp_path, "nemotron_h")
    assert checkpoint_dtype(FIXTURES / "nemotron_h") == "float32"
    assert checkpoint_dtype(bf16) == "bfloat16"
    llm = LLM(str(bf16), max_num_seqs=1, max_model_len=32)
    assert llm.model.dtype == jnp.bfloat16
    assert LLM(str(bf16), dtype="float32", max_num_seqs=1, max_model_len=32).model.dtype == (
        jnp.float32
    )
    (output,) = llm.generate([[3, 4, 5]], SamplingParams(max_tokens=2), use_tqdm=False)
    assert len(output.token_ids) >= 1


def test_cli_dtype_and_a_random_preset_in_bfloat16(capsys):
    code = main(
        [
            "generate",
            "--model",
            "tiny-mamba2",
            "--dtype",
            "bfloat16",
            "--prompt",
            "ab",
            "--max-tokens",
            "2",
            "--max-model-len",
            "32",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "model: tiny-mamba2 (Mamba2ForCausalLM" in out and "bfloat16" in out


@pytest.mark.parametrize("dtype", ["float16", "fp32", 3])
def test_unsupported_dtypes_are_named(dtype):
    with pytest.raises(ValueError, match=f"dtype={dtype!r} must be one of"):
        LLM("tiny-mamba2", dtype=dtype)


def test_cli_generates_from_a_hub_id_in_the_cache(tmp_path, monkeypatch, capsys):
    """`jmamba generate --model org/name` with the published-layout Qwen3.5 fixture in an offline
    hub cache: transformers' greedy token."""
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    add_fixture(tmp_path / "hub", "jmamba-tests/qwen3_5-moe-vl", FIXTURES / "qwen3_5_moe_vl")
    expected = np.load(FIXTURES / "qwen3_5_moe_vl" / "expected.npz")
    prompt = expected["seq_a"][:PROMPT_LEN].tolist()
    argv = ["generate", "--model", "jmamba-tests/qwen3_5-moe-vl", "--max-tokens", "1"]
    argv += ["--ignore-eos", "--prompt-ids", ",".join(map(str, prompt)), "--max-model-len", "64"]
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0, out
    assert f"[0] output: [{int(np.argmax(expected['logits_full_a'][PROMPT_LEN - 1]))}]" in out
    assert "model: jmamba-tests/qwen3_5-moe-vl (Qwen3_5MoeForConditionalGeneration" in out


def test_cli_names_the_cache_for_a_hub_id_it_lacks(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["generate", "--model", "org/absent", "--max-tokens", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("jmamba: error: model='org/absent': HF_HUB_OFFLINE is set")
    assert str(tmp_path / "hub") in err and "--model /path/to/dir" in err
