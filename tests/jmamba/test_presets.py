"""The built-in presets: the byte-level tokenizer, string prompts, and the trained `stdlib` model.

The trained model's text is not asserted (it is our own output); what is asserted is what an
independent observer would check: it loads through the checkpoint loader with its tokenizer,
greedy generation is deterministic and decodes to text, and on a held-out file of this
interpreter's standard library it predicts bytes better than any context-free model can.
"""

from __future__ import annotations

import json
import math
import sysconfig
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

import jmamba
from jmamba.loading import load_model
from jmamba.text.tokenizer import EOS_ID, EOS_TOKEN, VOCAB_SIZE, byte_alphabet, byte_tokenizer
from runtime.core.sampling_params import SamplingParams
from runtime.llm import LLM
from tests.jmamba.steps import Row, build

tokenizers = pytest.importorskip("tokenizers")
TRAINED = "stdlib"
TEXT = "def héllo(x):\n\treturn x  # ☃ \x00\x7f"


def test_byte_tokenizer_ids_are_the_utf8_bytes():
    tokenizer = byte_tokenizer()
    ids = tokenizer.encode(TEXT).ids
    assert ids == list(TEXT.encode("utf-8"))
    assert tokenizer.decode(ids) == TEXT
    assert tokenizer.token_to_id(EOS_TOKEN) == EOS_ID and tokenizer.get_vocab_size() == VOCAB_SIZE
    assert tokenizer.decode([*b"ab", EOS_ID, *b"c"]) == "abc"  # EOS is special: not printed
    assert set(byte_alphabet()) == set(tokenizers.pre_tokenizers.ByteLevel.alphabet())


@pytest.mark.parametrize("name", jmamba.presets.names())
def test_every_preset_takes_string_prompts(name):
    """Every preset comes with the byte tokenizer, and a string prompt's ids fit its vocabulary."""
    model, tokenizer = load_model(f"tiny-{name}")
    ids = tokenizer.encode(TEXT).ids
    assert max(ids) < model.config.vocab_size
    assert tokenizer.decode(ids) == TEXT


def test_trained_preset_is_a_checkpoint_directory_with_its_tokenizer():
    path = jmamba.presets.path(TRAINED)
    files = {p.name for p in path.iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= files
    assert json.loads((path / "tokenizer.json").read_text()) == json.loads(
        byte_tokenizer().to_str()
    )
    assert json.loads((path / "generation_config.json").read_text())["eos_token_id"] == EOS_ID
    config = jmamba.presets.tiny(TRAINED)
    assert config.vocab_size == VOCAB_SIZE and config.eos_token_ids == (EOS_ID,)
    assert len(set(config.mixers) - {jmamba.Mixer.NONE}) >= 2  # a hybrid
    with pytest.raises(ValueError, match="has no checkpoint directory"):
        jmamba.presets.path("mamba2")


def test_greedy_generation_from_text_is_deterministic():
    llm = LLM(
        f"tiny-{TRAINED}", max_num_seqs=1, max_model_len=64, max_num_batched_tokens=64, warmup=False
    )
    params = SamplingParams(max_tokens=12, temperature=0.0)
    first, again = (llm.generate(["def "], params, use_tqdm=False) for _ in range(2))
    assert first[0].token_ids == again[0].token_ids
    assert len(first[0].token_ids) == 12 or first[0].token_ids[-1] == EOS_ID
    assert isinstance(first[0].text, str) and first[0].text == llm.tokenizer.decode(
        first[0].token_ids
    )


def heldout_text(num_bytes: int) -> bytes:
    """`num_bytes` of the first file that training held out and this interpreter has."""
    record = json.loads((jmamba.presets.path(TRAINED) / "training.json").read_text())
    root = Path(sysconfig.get_paths()["stdlib"])
    for relative in record["corpus"]["heldout_files"]:
        data = (root / relative).read_bytes() if (root / relative).is_file() else b""
        if len(data) >= num_bytes:
            return data[:num_bytes]
    pytest.skip("none of the held-out files is in this interpreter's standard library")


def unigram_entropy_bits(data: bytes) -> float:
    """Entropy of the byte frequencies of `data` itself: the best any context-free model can do
    on it, even one fitted to this very text."""
    counts = np.bincount(np.frombuffer(data, np.uint8), minlength=256)
    p = counts[counts > 0] / len(data)
    return float(-(p * np.log2(p)).sum())


def test_trained_weights_beat_a_context_free_model_on_heldout_text():
    data = heldout_text(512)
    tokens = list(data)
    trained = jmamba.load_pretrained(jmamba.presets.path(TRAINED))
    untrained = jmamba.HybridLM(trained.config, rngs=nnx.Rngs(0))
    graphdef, _ = nnx.split(trained)
    inputs = build(
        [],
        [Row(tokens[:-1], 0, 0, 1, list(range(1, 33)))],
        block_size=16,
        max_blocks=32,
        all_logits=True,
    )

    @jax.jit
    def bits_per_byte(params):
        model = nnx.merge(graphdef, params)
        caches = model.init_caches(num_blocks=33, block_size=16, num_slots=2)
        logits, _ = model(inputs, caches)
        log_probs = jax.nn.log_softmax(logits, axis=-1)
        return -log_probs[np.arange(len(tokens) - 1), np.array(tokens[1:])].mean() / math.log(2)

    bound = unigram_entropy_bits(data)
    assert float(bits_per_byte(nnx.state(untrained))) > bound  # the check can fail
    assert float(bits_per_byte(nnx.state(trained))) < bound - 1.0
