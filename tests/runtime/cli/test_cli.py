"""`jmamba generate` and `LLM` end to end: text prompts through a tokenizer.json, and errors."""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

import pytest

from runtime.cli import main, parser
from runtime.cli.engine_options import add_engine_options, engine_options
from runtime.core.config import DEFAULT_DECODE_STEPS
from runtime.core.sampling_params import SamplingParams
from runtime.core.speculative_config import SpeculativeConfig
from runtime.llm import LLM

FIXTURE = Path(__file__).parents[2] / "fixtures" / "mamba2"


def write_tokenizer(path: Path, vocab_size: int = 64) -> None:
    """A word-level tokenizer.json over words w0..w{n-1} (ids below the model's vocab)."""
    tokenizers = pytest.importorskip("tokenizers")
    vocab = {f"w{i}": i for i in range(vocab_size)} | {"[UNK]": vocab_size}
    model = tokenizers.models.WordLevel(vocab, unk_token="[UNK]")
    tokenizer = tokenizers.Tokenizer(model)
    tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tokenizer.save(str(path / "tokenizer.json"))


def test_generate_text_prompts_from_checkpoint_dir(tmp_path, capsys):
    """A checkpoint dir with tokenizer.json: text in, text out, finish reason and variant count."""
    for name in ("config.json", "model.safetensors"):
        shutil.copy(FIXTURE / name, tmp_path / name)
    write_tokenizer(tmp_path)
    code = main(
        [
            "generate",
            "--model",
            str(tmp_path),
            "--prompt",
            "w1 w2 w3",
            "--prompt",
            "w7",
            "--max-tokens",
            "4",
            "--max-num-seqs",
            "2",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("finish reason: length") == 2 and "[0] prompt: 'w1 w2 w3'" in out
    assert "[1] output: '" in out and "4 tokens" in out
    assert "model: " in out and "(Mamba2ForCausalLM" in out and "tokenizer.json" in out
    assert "compile" in out and "step variants" in out and "tokens/s" in out


def test_generate_with_a_real_chunk_size_uses_a_derived_budget(tmp_path, capsys):
    """Mamba2 checkpoints use chunk_size 256: the default budget (derived: 512) lets it start
    (with asynchronous scheduling on)."""
    for name in ("config.json", "model.safetensors"):
        shutil.copy(FIXTURE / name, tmp_path / name)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"chunk_size": 256}))
    code = main(
        [
            "generate",
            "--model",
            str(tmp_path),
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "2",
            "--ignore-eos",
            "--async-scheduling",
            "--batch-invariant",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    assert "[0] output: [" in out and "finish reason: length" in out and "no tokenizer" in out


def test_default_run_is_the_trained_preset_on_text(capsys):
    """No arguments but a short length: the trained preset, the text prompt 'def ', and every
    labelled part of the report."""
    assert main(["generate", "--max-tokens", "6"]) == 0
    out = capsys.readouterr().out
    assert "[0] prompt: 'def '" in out and "[0] output: '" in out
    assert "6 tokens, finish reason: length, time to first token: " in out
    assert "model: tiny-stdlib (NemotronHForCausalLM" in out
    for part in ("time: import", "load", "compile", "run", "speed: 6 tokens generated"):
        assert part in out


def test_help_shows_defaults_and_presets(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: tiny-stdlib)" in out and "(default: auto)" in out
    for preset in ("tiny-mamba2", "tiny-nemotron_h", "tiny-qwen3_next", "tiny-stdlib"):
        assert preset in out.replace("tiny- ", "tiny-")


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--model", "tiny-nope"], "unknown preset 'tiny-nope'"),
        (["--model", "tiny-mamba2", "--top-p", "2"], "top_p=2.0"),
        (["--prompt-ids", "1,x"], "comma-separated ints"),
        (["--min-tokens", "20", "--max-tokens", "4"], "min_tokens=20 must be an int in [0, 4]"),
        (["--max-num-batched-tokens", "8"], "max_num_batched_tokens=8 must be >= chunk_size"),
        (["--state-block-size", "24"], "state_block_size=24 must be a multiple of block_size=16"),
        (
            ["--prefix-caching", "all", "--max-cached-states", "0"],
            "prefix_caching='all' cannot work: max_cached_states=0",
        ),
        (
            ["--speculative-method", "ngram", "--speculative-max-batch-size", "0"],
            "max_batch_size=0 must be an int",
        ),
    ],
)
def test_cli_errors_name_the_problem(argv, message, capsys):
    assert main(["generate", *argv]) == 2
    assert message in capsys.readouterr().err


def test_cli_prefix_caching_options_and_hit_counters(capsys):
    """Two equal 40-token prompts one after the other (max_num_seqs 1): the second hits the
    longest multiple of the 16-token state block below 40, 32 tokens; both print the same ids."""
    prompt = ",".join(str(i % 50 + 1) for i in range(40))
    code = main(
        [
            "generate",
            "--model",
            "tiny-mamba2",
            "--prompt-ids",
            prompt,
            "--prompt-ids",
            prompt,
            "--max-tokens",
            "3",
            "--ignore-eos",
            "--max-num-seqs",
            "1",
            "--prefix-caching",
            "all",
            "--state-block-size",
            "16",
            "--max-cached-states",
            "4",
        ]
    )
    out = capsys.readouterr().out
    assert code == 0, out
    lines = [line.split(": ", 1)[1] for line in out.splitlines() if "] output:" in line]
    assert len(lines) == 2 and lines[0] == lines[1]
    assert "prefix cache (all): 1/2 requests hit, 32/80 prompt tokens skipped" in out


def test_cli_rejects_an_unknown_prefix_caching_mode(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--prefix-caching", "some"])
    assert "invalid choice: 'some'" in capsys.readouterr().err


def test_llm_passes_prefix_caching_options_and_shows_the_counters():
    """Mode "align", 32-token state blocks: the second of two equal 40-token prompts (run one after
    the other) skips 32 tokens and generates what the first did; "off" has no counters."""
    llm = LLM(
        "tiny-mamba2",
        warmup=False,
        max_num_seqs=1,
        max_model_len=64,
        prefix_caching="align",
        state_block_size=32,
        max_cached_states=2,
    )
    prompt = [i % 50 + 3 for i in range(40)]
    first, second = llm.generate(
        [prompt, prompt], SamplingParams(max_tokens=3, ignore_eos=True), use_tqdm=False
    )
    assert first.token_ids == second.token_ids
    assert (first.num_cached_tokens, second.num_cached_tokens) == (0, 32)
    stats = llm.prefix_cache_stats
    assert (stats.lookups, stats.hits, stats.hit_tokens, stats.lookup_tokens) == (2, 1, 32, 80)
    assert llm.stats.ranks[0].prefix_cache.hits == 1
    assert LLM("tiny-mamba2", warmup=False, prefix_caching="off").prefix_cache_stats is None


def test_llm_schedules_asynchronously_unless_every_step_drafts():
    """LLM's default: asynchronous scheduling unless speculative decoding drafts in every step
    (then every step would run synchronously anyway); with a max_batch_size or adaptive
    drafting, on; an explicit value is kept."""
    assert LLM("tiny-mamba2").engine.config.async_scheduling
    assert not LLM("tiny-mamba2", async_scheduling=False).engine.config.async_scheduling
    speculative = {"num_speculative_tokens": 2}
    assert not LLM("tiny-mamba2", speculative=speculative).engine.config.async_scheduling
    for selective in ({"max_batch_size": 4}, {"adaptive": True}):
        limited = speculative | selective
        assert LLM("tiny-mamba2", speculative=limited).engine.config.async_scheduling
    explicit = LLM("tiny-mamba2", speculative=speculative, async_scheduling=True)
    assert explicit.engine.config.async_scheduling


def test_cli_speculative_and_batch_invariant_options_reach_the_config():
    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    args = parser.parse_args(["--speculative-method", "mtp", "--speculative-max-batch-size", "8"])
    assert engine_options(args)["speculative"] == SpeculativeConfig("mtp", 3, max_batch_size=8)
    args = parser.parse_args(["--speculative-method", "ngram", "--speculative-adaptive"])
    assert engine_options(args)["speculative"] == SpeculativeConfig("ngram", 3, adaptive=True)
    assert not engine_options(args)["batch_invariant"]
    assert engine_options(parser.parse_args(["--batch-invariant"]))["batch_invariant"]


def test_cli_cache_dtype_flags_parse_and_bad_ones_are_refused(capsys):
    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    default = engine_options(parser.parse_args([]))
    assert (default["kv_cache_dtype"], default["state_dtype"]) == ("auto", "float32")
    argv = ["--kv-cache-dtype", "fp8_e4m3", "--state-dtype", "bfloat16"]
    options = engine_options(parser.parse_args(argv))
    assert (options["kv_cache_dtype"], options["state_dtype"]) == ("fp8_e4m3", "bfloat16")
    with pytest.raises(SystemExit):
        parser.parse_args(["--kv-cache-dtype", "int8"])
    assert "invalid choice: 'int8'" in capsys.readouterr().err


def test_decode_steps_reach_the_config_from_the_cli_and_llm():
    """Several decode steps a program by default (`DEFAULT_DECODE_STEPS`), 1 when asked, a bad
    count refused by name; LLM's default is the CLI's."""
    parser = argparse.ArgumentParser()
    add_engine_options(parser)
    assert engine_options(parser.parse_args([]))["decode_steps"] == DEFAULT_DECODE_STEPS > 1
    assert engine_options(parser.parse_args(["--decode-steps", "1"]))["decode_steps"] == 1
    assert LLM("tiny-mamba2").engine.config.decode_steps == DEFAULT_DECODE_STEPS
    with pytest.raises(ValueError, match=r"decode_steps=0 must be an int in \[1, 64\]"):
        LLM("tiny-mamba2", decode_steps=0)


def test_one_sampler_program_is_the_servers_default_and_not_generates():
    """`jmamba serve` runs greedy steps in the sampled program by default (it warms both modes);
    `jmamba generate` and `LLM` do not; either way the flag turns it."""
    jmamba = parser()

    def merged(*argv: str) -> bool:
        return engine_options(jmamba.parse_args(list(argv)))["one_sampler_program"]

    assert merged("generate") is False and merged("generate", "--one-sampler-program") is True
    assert merged("serve") is True and merged("serve", "--no-one-sampler-program") is False
    assert LLM("tiny-mamba2").engine.config.one_sampler_program is False


def test_llm_refuses_a_state_block_shorter_than_a_chunk():
    message = (
        r"state_block_size=8 must be a multiple of the model's chunk_size=16 and of "
        r"block_size=8 \(it is shorter than one chunk\): one of 16, 32, 48"
    )
    with pytest.raises(ValueError, match=message):
        LLM("tiny-mamba2", warmup=False, block_size=8, state_block_size=8)


def test_llm_names_a_bad_warmup_value():
    with pytest.raises(ValueError, match="warmup='yes' must be False, True"):
        LLM("tiny-mamba2", warmup="yes")
