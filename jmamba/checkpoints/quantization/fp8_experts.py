"""FP8 expert stacks kept in e4m3 at load (`jmamba.layers.fp8_experts`): which MoE layers of an
FP8 checkpoint keep them, the tensors they are read from, and the `Source`s of their scales.

A MoE is planned when every weight of its stacks is an FP8 per-expert weight, in either layout
the loader reads: one tensor per expert (`<p>.experts.<e>.<proj>.weight` [out, in], its scale
`<proj>.weight_scale(_inv)`), or transformers' packed stacks (`<p>.experts.gate_up_proj` [E, 2I,
H], `down_proj` [E, H, I], scales `gate_up_proj_scale(_inv)` [E, ...]), which are split here into
the per-expert weights and scale grids the name map reads (the gate's scale rows are the first
I / r of the packed grid). The stacks' parameters are then the e4m3 weights transposed and
stacked as before (`Source` of `experts`), and their `<proj>_scale` parameters the per-expert
grids transposed and stacked. Stays dequantized, with its reason in the plan: a MoE whose
stacks are fused in one tensor (Granite's `input_linear` / `output_linear`), one whose packed
gate | up halves a scale block straddles (r not dividing I), one not all of whose stacks are FP8.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping

import numpy as np

from jmamba.checkpoints.quantization.dequantization import grid_shape, scale_grid
from jmamba.checkpoints.quantization.quantized_tensors import QuantizedTensors
from jmamba.checkpoints.quantization.scheme import Fp8Scheme
from jmamba.checkpoints.skipped_tensors import PACKED_EXPERTS
from jmamba.checkpoints.source import Path_, Source
from jmamba.fp8_plan import Block
from jmamba.layers.fp8_experts import EXPERT_STACKS

Tensors = dict[str, np.ndarray]
Sources = Mapping[Path_, Source]
PER_EXPERT = re.compile(r"(.+\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight")
STACKS_REASON = "a stack of experts"  # every reason below starts with it


def fp8_weight_names(found: QuantizedTensors) -> Callable[[str], bool]:
    """Whether a name of the name map is an FP8 weight's: one of `found`, or an expert's slice
    of a packed FP8 stack (`<p>.experts.<e>.<proj>.weight`, `unpack_experts`' names)."""
    packed = {m[1] for name in found.scales if (m := PACKED_EXPERTS.fullmatch(name))}
    return lambda name: name in found.scales or name.rsplit(".", 3)[0] in packed


def expert_stacks(sources: Sources) -> dict[Path_, dict[str, Source]]:
    """The stacks' sources of each MoE, by its module path and the stack's name."""
    stacks: dict[Path_, dict[str, Source]] = {}
    for path, source in sources.items():
        if path and path[-1] in EXPERT_STACKS:
            stacks.setdefault(path[:-1], {})[str(path[-1])] = source
    return stacks


def _packed_name(name: str) -> str:
    """The packed stack an expert's weight `<p>.experts.<e>.<proj>.weight` is a slice of."""
    match = PER_EXPERT.fullmatch(name)
    assert match is not None
    return f"{match[1]}.{'down_proj' if match[3] == 'down_proj' else 'gate_up_proj'}"


def _kept_reason(
    stacks: dict[str, Source], found: QuantizedTensors, shapes: Mapping[str, tuple[int, ...]]
) -> str | None:
    """Why a MoE's FP8 stacks stay dequantized, or None: they stay e4m3."""
    names = [name for source in stacks.values() for name in source.names]
    if not all(PER_EXPERT.fullmatch(name) for name in names):
        return f"{STACKS_REASON} fused in one tensor (Granite's input_linear / output_linear)"
    fp8 = fp8_weight_names(found)
    if not all(fp8(name) for name in names):
        return f"{STACKS_REASON} not all of whose weights are FP8"
    rows = found.scheme.block[0]
    for name in (n for n in names if n not in found.scales and ".down_proj." not in n):
        half = shapes[_packed_name(name)][1] // 2
        if rows and half % rows:
            return f"{STACKS_REASON} whose {rows}-row scale blocks straddle the packed gate | up"
    return None


def expert_plan(
    sources: Sources, found: QuantizedTensors, shapes: Mapping[str, tuple[int, ...]]
) -> tuple[tuple[tuple[Path_, Block], ...], dict[Path_, str]]:
    """(module path, block as ours) of each MoE whose FP8 stacks stay e4m3, and the reason of
    each stack parameter built from FP8 weights that stays dequantized."""
    rows, cols = found.scheme.block  # of the [out, in] weights: ours is (cols, rows)
    fp8 = fp8_weight_names(found)
    planned, reasons = [], {}
    for moe, stacks in sorted(expert_stacks(sources).items(), key=str):
        if not any(fp8(n) for source in stacks.values() for n in source.names):
            continue
        reason = _kept_reason(stacks, found, shapes)
        if reason is None:
            planned.append((moe, (cols, rows)))
        else:
            reasons.update({(*moe, proj): reason for proj in stacks})
    return tuple(planned), reasons


def _packed_part(
    name: str, tensors: Mapping[str, np.ndarray], found: QuantizedTensors
) -> tuple[np.ndarray, np.ndarray]:
    """(e4m3 weight [out, in], scale grid) of one expert's slice of a packed stack."""
    match = PER_EXPERT.fullmatch(name)
    assert match is not None
    packed = _packed_name(name)
    stack, block = tensors[packed], found.scheme.block
    grid = scale_grid(tensors[found.scales[packed]], tuple(stack.shape), block)
    expert, proj = int(match[2]), match[3]
    if proj == "down_proj":
        return stack[expert], grid[expert]
    half = stack.shape[1] // 2
    rows = slice(0, half) if proj == "gate_proj" else slice(half, None)
    grid_rows = slice(None) if not block[0] else slice(0, half // block[0])
    if proj == "up_proj" and block[0]:
        grid_rows = slice(half // block[0], None)
    return stack[expert, rows], grid[expert, grid_rows]


def expert_tensors(
    scheme: Fp8Scheme,
    tensors: Mapping[str, np.ndarray],
    found: QuantizedTensors,
    experts: tuple[tuple[Path_, Block], ...],
    sources: Sources,
) -> tuple[Tensors, set[str]]:
    """(the planned stacks' per-expert e4m3 weights and scales under the name map's names and
    `scheme.scale_name`s, the checkpoint tensors they come from and the activation scales their
    weight-only product has no use for)."""
    stacks = expert_stacks(sources)
    out: Tensors = {}
    used: set[str] = set()
    for moe, _ in experts:
        for name in (n for source in stacks[moe].values() for n in source.names):
            if name in found.scales:  # one tensor per expert
                out[name], out[scheme.scale_name(name)] = tensors[name], tensors[found.scales[name]]
                used |= {name, found.scales[name]}
                weight = name
            else:
                out[name], out[scheme.scale_name(name)] = _packed_part(name, tensors, found)
                weight = _packed_name(name)
                used |= {weight, found.scales[weight]}
            if scheme.static_inputs:
                used.add(scheme.input_scale_name(weight))
    return out, used


def _not_written(_: np.ndarray) -> tuple[np.ndarray, ...]:
    raise ValueError("a model holding FP8 expert stacks is not written back as a checkpoint")


def expert_scale_sources(
    scheme: Fp8Scheme,
    experts: tuple[tuple[Path_, Block], ...],
    sources: Sources,
    tensors: Mapping[str, np.ndarray],
) -> dict[Path_, Source]:
    """Each planned stack's `<proj>_scale` parameter [E, G_in, G_out]: its experts' scale grids
    (of `expert_tensors`) transposed and stacked."""
    out: dict[Path_, Source] = {}
    stacks = expert_stacks(sources)
    for moe, _ in experts:
        for proj, source in stacks[moe].items():
            grid = grid_shape(tuple(tensors[source.names[0]].shape), scheme.block)
            names = tuple(scheme.scale_name(name) for name in source.names)
            build = lambda *ss, grid=grid: np.stack(  # noqa: E731
                [np.asarray(s, np.float32).reshape(grid).T for s in ss]
            )
            out[(*moe, f"{proj}_scale")] = Source(names, build, _not_written)
    return out
