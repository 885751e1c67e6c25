"""`jmamba generate` and `LLM` end to end: text prompts through a tokenizer.json, and errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from runtime.cli import main

FIXTURE = Path(__file__).parents[1] / "fixtures" / "mamba2"


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
    code = main(["generate", "--model", str(tmp_path), "--prompt", "w1 w2 w3", "--prompt",
                 "w7", "--max-tokens", "4", "--max-num-seqs", "2"])  # fmt: skip
    out = capsys.readouterr().out
    assert code == 0, out
    assert out.count("finish reason: length") == 2 and "[0] prompt: 'w1 w2 w3'" in out
    assert "[1] output: '" in out and "4 tokens" in out
    assert "model: " in out and "(Mamba2ForCausalLM" in out and "tokenizer.json" in out
    assert "compile" in out and "step variants" in out and "tokens/s" in out


def test_generate_with_a_real_chunk_size_uses_a_derived_budget(tmp_path, capsys):
    """Mamba2 checkpoints use chunk_size 256: the default budget (derived: 512) lets it start."""
    for name in ("config.json", "model.safetensors"):
        shutil.copy(FIXTURE / name, tmp_path / name)
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps(config | {"chunk_size": 256}))
    code = main(["generate", "--model", str(tmp_path), "--prompt-ids", "1,2,3", "--max-tokens",
                 "2", "--ignore-eos"])  # fmt: skip
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
    ],
)
def test_cli_errors_name_the_problem(argv, message, capsys):
    assert main(["generate", *argv]) == 2
    assert message in capsys.readouterr().err
