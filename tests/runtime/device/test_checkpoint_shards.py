"""Loading a checkpoint shard by shard (`CheckpointShards`, `jmamba.checkpoints.shards`) on fake CPU
devices with tp = 2: the placed parameters equal, bit for bit, those of the whole checkpoint
loaded and sliced on the host (`place_params`), and an instrumented reader shows that every
tensor a shard splits was read as slices (elements read per read), every tensor read once."""

from __future__ import annotations

import collections
import json
import re
import shutil
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx
from safetensors.numpy import save_file

from jmamba.checkpoints.families.registry import load_hf_config
from jmamba.checkpoints.files import read_safetensors
from jmamba.checkpoints.name_map import tensor_sources
from jmamba.checkpoints.reader import TensorReader
from jmamba.checkpoints.weights import load_pretrained
from jmamba.loading import load_model_shapes
from runtime.device.distributed import make_mesh
from runtime.device.placement import CheckpointShards, place_params
from tests.jmamba.fixture_runs import FIXTURES

TP = 2


class CountingReader(TensorReader):
    """Records (name, elements) of every read."""

    def __init__(self, model_dir: Path) -> None:
        super().__init__(model_dir)
        self.reads: list[tuple[str, int]] = []
        READERS.append(self)

    def read(self, name, index=None):
        value = super().read(name, index)
        self.reads.append((name, value.size))
        return value


READERS: list[CountingReader] = []


def placed_both_ways(model_dir: Path, dtype: str = "float32"):
    """(sliced leaves, whole-then-sliced leaves, the counting reader)."""
    READERS.clear()
    mesh = make_mesh(1, TP)
    shapes, _ = load_model_shapes(model_dir, dtype)
    sliced = CheckpointShards(model_dir, reader=CountingReader)(shapes, mesh)
    whole = place_params(load_pretrained(model_dir, dtype, host=True), mesh)
    [reader] = READERS
    return sliced, whole, reader


def assert_bit_identical(sliced, whole) -> None:
    assert sliced.treedef == whole.treedef
    for a, b in zip(sliced.leaves, whole.leaves, strict=True):
        assert a.dtype == b.dtype and a.sharding == b.sharding
        np.testing.assert_array_equal(
            np.asarray(jax.device_get(a)).view(np.uint8),
            np.asarray(jax.device_get(b)).view(np.uint8),
        )


@pytest.mark.parametrize(
    ("name", "dtype"),
    [
        ("qwen3_next", "float32"),
        ("nemotron_h", "bfloat16"),
        ("falcon_h1", "float32"),
        ("granite_h", "float32"),
    ],
)
def test_shards_read_as_slices_equal_the_whole_checkpoint_sliced(name, dtype):
    sliced, whole, reader = placed_both_ways(FIXTURES / name, dtype)
    assert_bit_identical(sliced, whole)
    sizes = {n: int(np.prod(reader.shape(n))) for n in reader.names()}
    read = {}
    for n, count in reader.reads:
        read.setdefault(n, []).append(count)
    # Every tensor read once in all, but a fused one, read whole by each parameter it holds.
    uses = collections.Counter(
        n
        for source in tensor_sources(load_hf_config(FIXTURES / name)).values()
        for n in source.names
    )
    assert {n: sum(counts) for n, counts in read.items()} == {n: sizes[n] * uses[n] for n in read}
    embed = next(
        n for n in read if n.endswith("embed_tokens.weight") or n.endswith("embeddings.weight")
    )
    assert read[embed] == [sizes[embed] // TP] * TP  # the vocabulary: half each
    o_proj = next(n for n in read if n.endswith("o_proj.weight"))
    assert read[o_proj] == [sizes[o_proj] // TP] * TP  # row-parallel: half the input columns


def test_what_cannot_be_sliced_is_read_whole_once():
    """Qwen3-Next's interleaved q|k|v|z projection: one read of the whole tensor."""
    _, _, reader = placed_both_ways(FIXTURES / "qwen3_next")
    qkvz = [(n, c) for n, c in reader.reads if n.endswith("in_proj_qkvz.weight")]
    assert qkvz and all(c == int(np.prod(reader.shape(n))) for n, c in qkvz)
    assert len({n for n, _ in qkvz}) == len(qkvz)


def packed_checkpoint(tmp_path: Path) -> Path:
    """The Qwen3.5 MoE fixture with its experts packed as the published checkpoints store them:
    `experts.gate_up_proj` [E, 2I, H] and `experts.down_proj` [E, H, I] per layer."""
    source = FIXTURES / "qwen3_5_moe"
    tensors = read_safetensors(source)
    pattern = re.compile(r"(.+\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")
    experts: dict[str, dict[str, dict[int, np.ndarray]]] = {}
    packed = {}
    for name, value in tensors.items():
        match = pattern.fullmatch(name)
        if match is None:
            packed[name] = value
        else:
            experts.setdefault(match[1], {}).setdefault(match[3], {})[int(match[2])] = value
    for prefix, parts in experts.items():
        order = sorted(parts["down_proj"])
        gate_up = [np.concatenate([parts["gate_proj"][e], parts["up_proj"][e]]) for e in order]
        packed[f"{prefix}.gate_up_proj"] = np.stack(gate_up)
        packed[f"{prefix}.down_proj"] = np.stack([parts["down_proj"][e] for e in order])
    target = tmp_path / "packed"
    target.mkdir()
    shutil.copy(source / "config.json", target / "config.json")
    save_file(packed, target / "model.safetensors")
    assert json.loads((target / "config.json").read_text())
    return target


def test_packed_experts_are_read_expert_by_expert(tmp_path):
    sliced, whole, reader = placed_both_ways(packed_checkpoint(tmp_path))
    assert_bit_identical(sliced, whole)
    gates = [(n, c) for n, c in reader.reads if ".experts." in n and n.endswith("gate_proj.weight")]
    assert gates and all(c == int(np.prod(reader.shape(n))) for n, c in gates)  # one expert each
    total = sum(int(np.prod(reader.shape(n))) for n in reader.names())
    assert reader.elements_read == total  # every element once, none twice


def test_llm_on_two_shards_reads_the_checkpoint_as_slices():
    """`LLM(dir, tensor_parallel_size=2)` keeps the model as shapes only and generates the tokens
    of one device."""
    from runtime import LLM, SamplingParams

    options = dict(max_num_seqs=2, max_model_len=64, prefix_caching="off", freeze_gc=False)
    params = SamplingParams(max_tokens=3, ignore_eos=True)
    prompt = [[3, 5, 7, 11, 13]]
    one = LLM(str(FIXTURES / "mamba2"), **options).generate(prompt, params, use_tqdm=False)
    llm = LLM(str(FIXTURES / "mamba2"), tensor_parallel_size=2, **options)
    assert all(isinstance(v, jax.ShapeDtypeStruct) for v in jax.tree.leaves(nnx.state(llm.model)))
    two = llm.generate(prompt, params, use_tqdm=False)
    assert two[0].token_ids == one[0].token_ids
