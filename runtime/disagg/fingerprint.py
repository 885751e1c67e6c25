"""`Fingerprint`: what a prefill and a decode instance must share for a hand-over to continue
bitwise, as one digest (no jax).

Two engines can exchange a request's blocks and state slot only if the rows mean the same on both
sides: the same model (its whole `ModelConfig`: layer pattern, shapes, chunk size, EOS ids), the
same KV block size, the same cache dtypes and numerics switches, and every cache leaf's row shape
and dtype in the same order (`PoolRows.row_layout`). Pool sizes may differ (a decode instance
usually holds more blocks). The weights are not hashed (reading them costs a pass over every
parameter): `label` names them, e.g. a checkpoint path and revision, and the two sides must give
the same one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence

from jmamba.config import ModelConfig
from runtime.core.config import EngineConfig


@dataclasses.dataclass(frozen=True)
class Fingerprint:
    """A digest of what a hand-over's rows depend on, and what it was made from.

    Attributes:
      digest: 16 hex digits of sha256 over `parts`.
      parts: the described values (JSON-ready), for an error message naming what differs.
    """

    digest: str
    parts: dict[str, str]

    @classmethod
    def of(
        cls,
        model: ModelConfig,
        config: EngineConfig,
        row_layout: Sequence[tuple[str, tuple[int, ...], str]],
        label: str = "",
    ) -> Fingerprint:
        """The fingerprint of an engine serving `model` with `config`, whose caches' rows are
        `row_layout` (`PoolRows.row_layout`); `label` names the weights."""
        parts = {
            "model": repr(model),
            "block_size": str(config.block_size),
            "cache_dtypes": repr(config.cache_dtypes),
            "batch_invariant": str(config.batch_invariant),
            "rows": json.dumps([[kind, list(shape), dtype] for kind, shape, dtype in row_layout]),
            "label": label,
        }
        text = json.dumps(parts, sort_keys=True).encode()
        return cls(hashlib.sha256(text).hexdigest()[:16], parts)

    def mismatch(self, other_digest: str) -> str | None:
        """None when a peer's digest equals this one, else the error message."""
        if other_digest == self.digest:
            return None
        return (
            f"the hand-over's fingerprint {other_digest} is not this engine's {self.digest}: "
            "the prefill and decode instances differ in model, weights label, block size, "
            "cache dtypes or cache layout"
        )
