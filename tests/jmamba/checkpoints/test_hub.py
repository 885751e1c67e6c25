"""Hugging Face hub ids ("org/name") as models, through a local cache laid out as the hub lays it
out (tests/jmamba/checkpoints/hub_cache.py): no network, `HF_HUB_CACHE` at a tmp dir and
`HF_HUB_OFFLINE=1`. The CLI path is in tests/runtime/engine/test_checkpoints.py."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from flax import nnx

from jmamba import load_model, load_pretrained
from jmamba.checkpoints import hub
from tests.jmamba.checkpoints.hub_cache import COMMIT, add_fixture

FIXTURES = Path(__file__).parents[2] / "fixtures"


def params_of(model) -> dict:
    return {p: np.asarray(v.get_value()) for p, v in nnx.to_flat_state(nnx.state(model))}


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty offline hub cache (HF_HUB_CACHE, HF_HUB_OFFLINE=1)."""
    cache = tmp_path / "hub-cache"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    return cache


@pytest.mark.parametrize(
    "name, expected",
    [
        ("Qwen/Qwen3.5-0.8B", True),
        ("nvidia/NVIDIA-Nemotron-Nano-9B-v2", True),
        ("state-spaces/mamba2-130m", True),
        ("a/b", True),
        ("org_/_name", True),
        ("tiny-stdlib", False),  # a preset: no slash
        ("org/name/extra", False),
        ("/abs/path", False),
        ("./org", False),
        ("org/", False),
        ("-org/name", False),
        ("org/name.", False),
        ("org/na--me", False),
        ("org/na..me", False),
        ("org/na me", False),
        ("org/" + "n" * 97, False),
    ],
)
def test_hub_ids_are_org_slash_name(name, expected):
    assert hub.is_hub_id(name) == expected


def test_load_model_reads_a_hub_id_from_the_cache(cache):
    snapshot = add_fixture(cache, "jmamba-tests/tiny-qwen3_5-vl", FIXTURES / "qwen3_5_vl")
    assert snapshot == cache / "models--jmamba-tests--tiny-qwen3_5-vl" / "snapshots" / COMMIT
    assert (snapshot / "model.safetensors").is_symlink()
    assert hub.snapshot("jmamba-tests/tiny-qwen3_5-vl") == snapshot
    model, tokenizer = load_model("jmamba-tests/tiny-qwen3_5-vl")
    assert tokenizer is None and model.config.architecture == "Qwen3_5ForConditionalGeneration"
    expected = params_of(load_pretrained(FIXTURES / "qwen3_5_vl"))
    loaded = params_of(model)
    assert loaded.keys() == expected.keys()
    assert all(np.array_equal(loaded[k], expected[k]) for k in expected)


def test_a_tokenizer_in_the_snapshot_is_loaded(cache, tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    word_level = tokenizers.models.WordLevel({"w0": 0, "[UNK]": 1}, unk_token="[UNK]")
    tokenizers.Tokenizer(word_level).save(str(tmp_path / "tokenizer.json"))
    snapshot = add_fixture(cache, "org/name", FIXTURES / "mamba2")
    (snapshot / "tokenizer.json").write_bytes((tmp_path / "tokenizer.json").read_bytes())
    _, tokenizer = load_model("org/name")
    assert tokenizer is not None and tokenizer.token_to_id("w0") == 0


def test_a_missing_hub_id_names_the_cache_and_the_local_alternative(cache):
    with pytest.raises(ValueError) as error:
        load_model("org/not-downloaded")
    message = str(error.value)
    assert "model='org/not-downloaded'" in message and "HF_HUB_OFFLINE is set" in message
    assert str(cache) in message and "--model /path/to/dir" in message


def test_the_cache_directory_follows_the_environment(monkeypatch, tmp_path):
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub.cache_dir() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert hub.cache_dir() == tmp_path / "xdg" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "home"))
    assert hub.cache_dir() == tmp_path / "home" / "hub"
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "cache"))
    assert hub.cache_dir() == tmp_path / "cache"


def test_without_huggingface_hub_the_error_says_what_to_install(cache, monkeypatch):
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # import fails
    with pytest.raises(ValueError) as error:
        load_model("org/name")
    message = str(error.value)
    assert "pip install 'jmamba[hub]'" in message and str(cache) in message
    assert "--model /path/to/dir" in message


def test_only_the_files_jmamba_reads_are_fetched(cache, monkeypatch):
    """Online: one snapshot_download of the main revision into the cache, limited to the config,
    tokenizer and safetensors files."""
    import huggingface_hub

    monkeypatch.delenv("HF_HUB_OFFLINE")
    calls = []
    snapshot = add_fixture(cache, "org/name", FIXTURES / "mamba2")

    def fake_snapshot_download(repo_id, **kwargs):
        calls.append((repo_id, kwargs))
        return str(snapshot)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot_download)
    load_model("org/name")
    assert calls == [
        (
            "org/name",
            {
                "cache_dir": cache,
                "allow_patterns": [
                    "config.json",
                    "generation_config.json",
                    "tokenizer.json",
                    "tokenizer_config.json",
                    "chat_template.jinja",
                    "special_tokens_map.json",
                    "*.safetensors",
                    "model.safetensors.index.json",
                ],
                "local_files_only": False,
            },
        )
    ]


@pytest.mark.parametrize(
    "error_name, expected",
    [
        ("LocalEntryNotFoundError", "the hub could not be reached and the Hugging Face cache"),
        ("RepositoryNotFoundError", "could not be fetched from the Hugging Face hub into"),
    ],
)
def test_hub_errors_become_value_errors(cache, monkeypatch, error_name, expected):
    """No network (or no such repository) while online: a ValueError naming the cache."""
    import huggingface_hub
    from huggingface_hub import errors

    monkeypatch.delenv("HF_HUB_OFFLINE")

    def failing(repo_id, **kwargs):
        error_class = getattr(errors, error_name)
        if error_name == "RepositoryNotFoundError":
            raise error_class("404 Client Error: Repository Not Found", response=_Response())
        raise error_class("cannot reach the hub")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", failing)
    with pytest.raises(ValueError, match=expected) as error:
        load_model("org/name")
    assert str(cache) in str(error.value) and "--model /path/to/dir" in str(error.value)


class _Response:
    """Enough of an HTTP response for huggingface_hub's HTTP errors."""

    status_code = 404
    headers: dict = {}
    request = None

    def json(self):
        return {}


def test_a_local_directory_wins_over_the_hub(cache, monkeypatch, tmp_path):
    """A relative path of the form org/name that exists is that directory, not the hub id."""
    add_fixture(cache, "org/name", FIXTURES / "mamba2")
    local = tmp_path / "work" / "org" / "name"
    local.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (local / name).write_bytes((FIXTURES / "qwen3_5" / name).read_bytes())
    monkeypatch.chdir(tmp_path / "work")
    model, _ = load_model("org/name")
    assert model.config.architecture == "Qwen3_5ForCausalLM"  # not the cached mamba2
