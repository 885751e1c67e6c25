"""What a checkpoint holds around its text model's tensors: the tensors loading skips (a multimodal
wrapper's vision tower, a multi-token-prediction head the config does not declare) and packed
expert tensors, split into the per-expert tensors the name map (`jmamba.checkpoints.name_map`)
expects."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

# The checkpoint tensors that are not the text model's, by architecture: (name prefix, what they
# are). Loading skips them and says so in one log line; transformers skips the same ones
# (`_keys_to_ignore_on_load_unexpected` of the Qwen3.5 classes). The multimodal wrappers hold a
# vision tower. A multi-token-prediction head (`mtp.*`, Qwen3-Next, Qwen3.5, Nemotron 3) is loaded
# when config.json counts its layers (`ModelConfig.has_mtp`, `jmamba.mtp`), else skipped too.
MTP = ("mtp.", "multi-token-prediction")
_VISION = ("model.visual.", "vision")
SKIPPED: dict[str, tuple[tuple[str, str], ...]] = {
    "Qwen3_5ForConditionalGeneration": (_VISION,),
    "Qwen3_5MoeForConditionalGeneration": (_VISION,),
}


def skipped_tensors(
    architecture: str, names: Any, *, has_mtp: bool = False
) -> dict[tuple[str, str], list[str]]:
    """The tensors among `names` that a checkpoint of `architecture` holds beside its text model
    (`SKIPPED`, and the MTP head's unless `has_mtp`), by (prefix, what they are); only groups
    with tensors appear."""
    groups: dict[tuple[str, str], list[str]] = {}
    for group in (*SKIPPED.get(architecture, ()), *(() if has_mtp else (MTP,))):
        found = sorted(n for n in names if n.startswith(group[0]))
        if found:
            groups[group] = found
    return groups


def skip_message(architecture: str, groups: dict[tuple[str, str], list[str]]) -> str:
    parts = [
        f"{len(names)} {what} tensor{'s' * (len(names) != 1)} ({prefix}*)"
        for (prefix, what), names in groups.items()
    ]
    return f"skipped {' and '.join(parts)} of a {architecture} checkpoint"


PACKED_EXPERTS = re.compile(r"(.+\.experts)\.(gate_up_proj|down_proj)")


def unpack_experts(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`tensors` with every packed expert tensor split into the per-expert tensors that
    transformers' `save_pretrained` writes: `<p>.experts.gate_up_proj` [E, 2I, H] into
    `<p>.experts.{e}.gate_proj.weight` (rows :I) and `<p>.experts.{e}.up_proj.weight` (rows I:),
    [I, H] each; `<p>.experts.down_proj` [E, H, I] into `<p>.experts.{e}.down_proj.weight`. The
    packed layout is transformers' in-memory one (`Qwen3_5MoeExperts`), the one in which the
    published Qwen3.5 MoE checkpoints are stored. The parts are views of the packed arrays."""
    out: dict[str, np.ndarray] = {}
    for name, tensor in tensors.items():
        match = PACKED_EXPERTS.fullmatch(name)
        if match is None:
            parts = {name: tensor}
        elif tensor.ndim != 3 or (match[2] == "gate_up_proj" and tensor.shape[1] % 2):
            raise ValueError(f"packed expert tensor {name} has shape {list(tensor.shape)}")
        elif match[2] == "down_proj":
            parts = {f"{match[1]}.{e}.down_proj.weight": t for e, t in enumerate(tensor)}
        else:
            gate, up = np.split(tensor, 2, axis=1)
            parts = {f"{match[1]}.{e}.gate_proj.weight": t for e, t in enumerate(gate)}
            parts.update({f"{match[1]}.{e}.up_proj.weight": t for e, t in enumerate(up)})
        clash = sorted(parts.keys() & out.keys())
        if clash:
            raise ValueError(f"expert tensors both packed and one by one in a checkpoint: {clash}")
        out.update(parts)
    return out
