"""`Handover`: one request passed from a prefill instance to a decode instance, and its bytes on
the wire (no jax).

It holds what the decode instance needs to go on as if it had computed the prompt itself: the
request (id, prompt, sampling params, its seed, so sampled requests keep their random stream),
the first token the prefill instance sampled, and the contents of the request's KV blocks and
state slot after the prompt, bitwise, with the fingerprint of the engine that wrote them. A
request whose first token already finished it (a stop token, `max_tokens=1`) is handed over
without contents and `finish_reason` set.

Wire format (`to_bytes` / `from_bytes`), no pickle: a 4-byte big-endian header length, a JSON
header (fields, and per array its dtype and shape), then each array's bytes in C order, block
rows first. dtypes are numpy names (`ml_dtypes` adds bfloat16 and the float8 types).
"""

from __future__ import annotations

import dataclasses
import json
import struct
from typing import Any

import ml_dtypes  # noqa: F401  (registers bfloat16 / float8 dtype names with numpy)
import numpy as np

from runtime.core.sampling_params import SamplingParams

_LENGTH = struct.Struct(">I")
# SamplingParams fields a hand-over carries; the others (stop strings, structured output,
# logprobs) hold host state the decode side would need too, and are refused (`carried_params`).
_CARRIED = (
    "temperature",
    "top_k",
    "top_p",
    "max_tokens",
    "min_tokens",
    "stop_token_ids",
    "ignore_eos",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
)


@dataclasses.dataclass(frozen=True)
class Handover:
    """A prefilled request on its way to a decode instance.

    Attributes:
      request_id: its id on both instances.
      prompt_token_ids: the prompt.
      output_token_ids: the tokens the prefill instance sampled (the first one).
      sampling: its sampling params' carried fields (`carried_params`).
      seed: the request's seed (its sampling key), as the prefill instance drew it.
      num_computed: tokens whose effect the rows hold (the prompt's length).
      fingerprint: the digest of the engine that wrote the rows (`Fingerprint`).
      block_rows: per KV block leaf of the caches, the request's blocks [n, block_size, ...].
      slot_rows: per state leaf, the request's slot row.
      finish_reason: None, or how the first token finished the request (then no rows).
    """

    request_id: str
    prompt_token_ids: tuple[int, ...]
    output_token_ids: tuple[int, ...]
    sampling: dict[str, Any]
    seed: int
    num_computed: int
    fingerprint: str
    block_rows: tuple[np.ndarray, ...] = ()
    slot_rows: tuple[np.ndarray, ...] = ()
    finish_reason: str | None = None

    @property
    def num_blocks(self) -> int:
        """KV blocks the rows fill (0 for a model without attention)."""
        return len(self.block_rows[0]) if self.block_rows else 0

    @property
    def nbytes(self) -> int:
        """Bytes of block and slot contents (what the transfer moves besides the header)."""
        return sum(a.nbytes for a in (*self.block_rows, *self.slot_rows))

    def sampling_params(self) -> SamplingParams:
        """The request's sampling params on the decode side, its seed included."""
        fields = dict(self.sampling)
        fields["stop_token_ids"] = tuple(fields["stop_token_ids"])
        return SamplingParams(**fields, seed=self.seed)

    def header(self) -> dict[str, Any]:
        """Every field but the rows' bytes, and each array's dtype name and shape: JSON-ready."""
        arrays = (*self.block_rows, *self.slot_rows)
        return {
            "request_id": self.request_id,
            "prompt_token_ids": list(self.prompt_token_ids),
            "output_token_ids": list(self.output_token_ids),
            "sampling": self.sampling,
            "seed": self.seed,
            "num_computed": self.num_computed,
            "fingerprint": self.fingerprint,
            "finish_reason": self.finish_reason,
            "num_block_rows": len(self.block_rows),
            "arrays": [[a.dtype.name, list(a.shape)] for a in arrays],
        }

    @classmethod
    def from_header(cls, header: dict[str, Any], arrays: list[np.ndarray]) -> Handover:
        """The hand-over of a `header()` and its arrays (block rows first); ValueError when
        the header is not one."""
        try:
            split = header["num_block_rows"]
            return cls(
                request_id=str(header["request_id"]),
                prompt_token_ids=tuple(header["prompt_token_ids"]),
                output_token_ids=tuple(header["output_token_ids"]),
                sampling=dict(header["sampling"]),
                seed=int(header["seed"]),
                num_computed=int(header["num_computed"]),
                fingerprint=str(header["fingerprint"]),
                block_rows=tuple(arrays[:split]),
                slot_rows=tuple(arrays[split:]),
                finish_reason=header["finish_reason"],
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"not a hand-over header ({type(e).__name__}: {e})") from e

    def to_bytes(self) -> bytes:
        """The wire form (module docstring)."""
        arrays = [np.ascontiguousarray(a) for a in (*self.block_rows, *self.slot_rows)]
        text = json.dumps(self.header()).encode()
        return b"".join([_LENGTH.pack(len(text)), text, *(a.tobytes() for a in arrays)])

    @classmethod
    def from_bytes(cls, data: bytes | memoryview) -> Handover:
        """A hand-over from its wire form; ValueError when the bytes are cut short, too long or
        not a hand-over."""
        view = memoryview(data)
        try:
            (length,) = _LENGTH.unpack_from(view)
            header = json.loads(bytes(view[_LENGTH.size : _LENGTH.size + length]))
            offset = _LENGTH.size + length
            arrays = []
            for dtype_name, shape in header["arrays"]:
                dtype = np.dtype(dtype_name)
                size = int(np.prod(shape)) * dtype.itemsize
                if offset + size > len(view):
                    raise ValueError(f"{len(view)} bytes: the arrays need {offset + size}")
                arrays.append(np.frombuffer(view[offset : offset + size], dtype).reshape(shape))
                offset += size
        except (struct.error, KeyError, TypeError, UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"not a hand-over ({type(e).__name__}: {e})") from e
        if offset != len(view):
            raise ValueError(f"{len(view) - offset} bytes after the last array")
        return cls.from_header(header, arrays)


def carried_params(params: SamplingParams) -> dict[str, Any]:
    """The fields of `params` a hand-over carries; ValueError for what it cannot carry yet."""
    refused = {
        "stop strings": bool(params.stop),
        "structured output": params.structured is not None,
        "logprobs": params.logprobs is not None,
    }
    if any(refused.values()):
        names = ", ".join(name for name, on in refused.items() if on)
        raise ValueError(f"a disaggregated request cannot use {names} yet (runtime/disagg)")
    fields = {name: getattr(params, name) for name in _CARRIED}
    fields["stop_token_ids"] = list(params.stop_token_ids)
    return fields
