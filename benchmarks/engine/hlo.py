"""Reading the compiled step's HLO text: opcode counts of its ENTRY computation, custom-call
targets, command buffers, and which part of the step (the model's named scopes) each instruction
belongs to."""

from __future__ import annotations

import collections
import re


def hlo_stats(text: str) -> dict:
    """Opcode counts of the ENTRY computation, custom-call targets, command-buffer mentions."""
    entry = text[text.index("ENTRY") :]
    entry = entry[: entry.index("\n}\n")] if "\n}\n" in entry else entry
    ops = collections.Counter(re.findall(r"= \S+ (\S+?)\(", entry))
    targets = collections.Counter(re.findall(r'custom_call_target="([^"]+)"', text))
    return {
        "entry_ops": dict(ops.most_common()),
        "entry_total": sum(ops.values()),
        "custom_call_targets": dict(targets),
        "fusions_total": len(re.findall(r"\bfusion\(", text)),
        "command_buffer_mentions": len(re.findall(r"command_buffer", text)),
    }


def instruction_parts(hlo_text: str) -> dict[str, str]:
    """HLO instruction name (and Pallas kernel name) -> the part of the step it belongs to: the
    named scope in its op_name metadata (`mixer_<Mixer>`, `ffn_<Ffn>`, `lm_head`, `sampler`, set
    by jmamba.model and runtime.device.model_runner), else "other" (embedding, input unpacking)."""
    parts = {}
    for match in re.finditer(
        r'^\s*(?:ROOT )?%?([\w.\-]+) = [^\n]*?op_name="([^"]+)"', hlo_text, re.M
    ):
        op_name = match.group(2)
        scope = re.search(r"(mixer_\w+?|ffn_\w+?|lm_head|sampler)(?:/|$)", op_name)
        part = scope.group(1) if scope else "other"
        parts[match.group(1)] = part
        kernel = re.search(r"/(\w+)/pallas_call$", op_name)  # a Pallas kernel keeps its name
        if kernel:
            parts[kernel.group(1)] = part
    return parts


def top_level(hlo: dict) -> str:
    """Command buffers, custom calls and fusions left in the ENTRY computation: a kernel outside
    every command buffer is launched by the host one by one."""
    ops = hlo["entry_ops"]
    return f"{ops.get('call', 0)} / {ops.get('custom-call', 0)} / {ops.get('fusion', 0)}"
