"""Compiled step programs kept on disk (runtime.device.executable_store): a warm start traces and
compiles no step and gives the cold start's tokens; a truncated, corrupt or foreign entry is
ignored, removed and rebuilt; the key changes with what changes the program."""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import jax
import pytest
from jax import monitoring

from runtime.core.sampling_inputs import SamplingMode
from runtime.core.sampling_params import SamplingParams
from runtime.device import compile_cache
from runtime.device.executable_store import MAGIC, ExecutableStore, describe
from runtime.device.memory import resolve_config
from runtime.device.model_runner import ModelRunner
from runtime.engine import Engine
from tests.runtime.conftest import base_config, model_and_runner, naive_greedy

FAMILY = "nemotron_h"  # attention, Mamba2 and an MLP: every cache kind
PROMPTS = [[5, 3, 9, 2, 7, 1, 4], [8, 8, 1]]


@contextlib.contextmanager
def counted() -> Iterator[Counter]:
    """Counts, while open, the traces of the step and every XLA compile."""
    events: Counter = Counter()

    def count(event: str, seconds: float, **kwargs) -> None:
        if event.endswith("jaxpr_trace_duration") and kwargs.get("fun_name") == "spmd_step":
            events["step traces"] += 1
        if "backend_compile" in event:
            events["compiles"] += 1

    monitoring.register_event_duration_secs_listener(count)
    try:
        yield events
    finally:
        monitoring.unregister_event_duration_listener(count)


def serve(store: ExecutableStore) -> tuple[ModelRunner, dict[str, list[int]]]:
    """A fresh runner on `store`, warmed with every variant, serving PROMPTS greedily."""
    model, _ = model_and_runner(FAMILY)
    config = base_config(FAMILY)
    runner = ModelRunner(model, resolve_config(model, config), executables=store)
    engine = Engine(model, config, runner=runner)
    engine.warmup(prefill=True)
    for i, prompt in enumerate(PROMPTS):
        engine.add_request(prompt, SamplingParams(max_tokens=5), request_id=str(i))
    outputs = {}
    while engine.has_unfinished:
        outputs |= {o.request_id: o.token_ids for o in engine.step()}
    return runner, outputs


@pytest.fixture(scope="module")
def cold(tmp_path_factory) -> tuple[Path, ModelRunner, dict[str, list[int]]]:
    """A store filled by a cold start, and what that start served."""
    directory = tmp_path_factory.mktemp("steps")
    runner, outputs = serve(ExecutableStore(directory))
    return directory, runner, outputs


def test_a_cold_start_stores_every_variant_and_serves_the_naive_loop(cold):
    directory, runner, outputs = cold
    assert runner.executables.num_saved == runner.num_variants == len(list(directory.iterdir()))
    assert runner.load_seconds == {} and len(runner.compile_seconds) == runner.num_variants
    for i, prompt in enumerate(PROMPTS):
        assert outputs[str(i)] == naive_greedy(FAMILY, prompt, 5)


def test_a_warm_start_traces_and_compiles_no_step(cold, tmp_path):
    directory, cold_runner, cold_outputs = cold
    warm_dir = tmp_path / "steps"
    shutil.copytree(directory, warm_dir)
    with counted() as events:
        runner, outputs = serve(ExecutableStore(warm_dir))
    assert events["step traces"] == 0
    # The step programs load; what compiles is the few small programs around them (placing
    # the caches, the input copy), which JAX's persistent cache holds across processes.
    assert events["compiles"] < runner.num_variants
    assert runner.executables.num_loaded == runner.num_variants == cold_runner.num_variants
    assert runner.compile_seconds == {} and set(runner.load_seconds) == set(runner.variants)
    assert outputs == cold_outputs


@pytest.mark.parametrize("damage", ["truncated", "flipped", "foreign"])
def test_a_damaged_entry_is_ignored_removed_and_rebuilt(cold, tmp_path, damage):
    directory, cold_runner, cold_outputs = cold
    store_dir = tmp_path / "steps"
    shutil.copytree(directory, store_dir)
    entries = sorted(store_dir.iterdir())
    victim, other = entries[0], entries[1]
    data = victim.read_bytes()
    if damage == "truncated":
        victim.write_bytes(data[: len(data) // 2])
    elif damage == "flipped":  # one byte of the payload
        victim.write_bytes(data[:-100] + bytes([data[-100] ^ 0xFF]) + data[-99:])
    else:  # another program's entry under this name
        victim.write_bytes(other.read_bytes())
    runner, outputs = serve(ExecutableStore(store_dir))
    store = runner.executables
    assert (store.num_rejected, store.num_saved) == (1, 1)
    assert store.num_loaded == cold_runner.num_variants - 1
    # Rebuilt in place: the entry's header (its program's description) is the original's.
    header = len(MAGIC) + 8 + int.from_bytes(data[len(MAGIC) : len(MAGIC) + 8], "little")
    assert victim.read_bytes()[:header] == data[:header]
    assert outputs == cold_outputs


def test_the_key_follows_what_changes_the_program():
    """The description differs with the sampling mode, the model and an argument's shape, and
    is the same text when nothing changes."""
    _, runner = model_and_runner(FAMILY)
    spec = dataclasses.make_dataclass("Spec", ["mode", "config"], frozen=True)
    arguments = [runner.caches]
    plain = describe(spec(SamplingMode(), "a"), arguments)
    assert plain == describe(spec(SamplingMode(), "a"), arguments)
    assert plain != describe(spec(SamplingMode(sampled=True), "a"), arguments)
    assert plain != describe(spec(SamplingMode(), "b"), arguments)
    assert plain != describe(spec(SamplingMode(), "a"), [runner.caches, runner.caches])


def test_a_spec_that_names_an_object_by_address_is_refused():
    class Opaque:
        pass

    with pytest.raises(ValueError, match="by address"):
        describe((Opaque(),), [])


def test_a_store_without_a_directory_keeps_nothing():
    store = ExecutableStore(None)
    store.save("anything", object())
    assert store.load("anything", []) is None and store.num_saved == 0


def test_the_default_store_sits_in_jaxs_cache_and_obeys_its_switch(monkeypatch, tmp_path):
    """`compile_cache.step_store`: the `steps/` folder of JAX's cache directory; none when
    JAX's cache is off, JMAMBA_STEP_STORE is off or the backend is the CPU."""
    before = jax.config.jax_compilation_cache_dir
    try:
        jax.config.update("jax_compilation_cache_dir", str(tmp_path))
        monkeypatch.setenv(compile_cache.STEP_STORE_ENV, "1")
        assert compile_cache.step_store().directory is None  # this CPU
        monkeypatch.setattr(jax, "default_backend", lambda: "gpu")
        assert compile_cache.step_store().directory == tmp_path / "steps"
        monkeypatch.setenv(compile_cache.STEP_STORE_ENV, "off")
        assert compile_cache.step_store().directory is None
        jax.config.update("jax_compilation_cache_dir", None)
        monkeypatch.delenv(compile_cache.STEP_STORE_ENV)
        assert compile_cache.step_store().directory is None
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
