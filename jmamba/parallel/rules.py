"""How one parameter or state splits over T tensor-parallel shards: `Segment`s along one axis.

An axis that tensor parallelism splits is a run of segments, each a count of equal units: heads
(q_proj's columns are `num_heads` units of `head_dim`), groups, experts, channels. Mamba2's in_proj
columns are five segments, [z | x | B | C | dt]. Shard t of T takes, from every segment, the units
of its own heads:

- units a multiple of T: the t-th run of units / T consecutive units;
- T a multiple of units, for a `replicable` segment (inputs that several heads read: KV heads, B/C
  groups, Gated DeltaNet key heads): the one unit its heads use, t // (T / units), the same on the
  T / units shards that share it;
- a `padded` segment (the vocabulary): ceil(units / T) units each, the last shard's filled with
  zeros past the end;
- anything else: a `ShardError` naming the config field.

A segment that feeds a row-parallel projection (query heads, value heads, MLP channels, experts)
is never replicable: each shard's partial output would be added twice.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np


class ShardError(ValueError):
    """A config field that T shards cannot split (`jmamba.sharding.shard_config` adds the sizes
    that work)."""


@dataclasses.dataclass(frozen=True)
class Segment:
    """`units` units of `unit_size` entries each, from config field `field`."""

    field: str
    units: int
    unit_size: int = 1
    replicable: bool = False
    padded: bool = False

    def local_units(self, shards: int) -> int:
        """Units each of `shards` shards holds; ShardError when they cannot split."""
        if self.padded:
            return math.ceil(self.units / shards)
        if self.units % shards == 0:
            return self.units // shards
        if self.replicable and shards % self.units == 0:
            return 1
        kind = "split or share" if self.replicable else "split"
        raise ShardError(f"tensor_parallel_size={shards} cannot {kind} {self.field}={self.units}")

    def span(self, shard: int, shards: int) -> tuple[int, int, int]:
        """(start, stop, pad): shard `shard` takes this segment's entries [start, stop) and `pad`
        zeros after them (a padded segment's tail)."""
        local = self.local_units(shards)
        if self.units % shards == 0 or self.padded:
            first = shard * local
        else:  # replicated: the unit of this shard's heads
            first = shard // (shards // self.units)
        start, stop = first * self.unit_size, (first + local) * self.unit_size
        end = min(stop, self.size)
        return min(start, end), end, stop - max(start, end)

    def take(self, part: np.ndarray, shard: int, shards: int, axis: int) -> np.ndarray:
        """Shard `shard`'s entries of this segment (`part`: the segment's entries along `axis`)."""
        start, stop, pad = self.span(shard, shards)
        taken = np.take(part, np.arange(start, stop), axis=axis)
        if pad:  # a padded segment's tail: zeros
            widths = [(0, 0)] * part.ndim
            widths[axis] = (0, pad)
            taken = np.pad(taken, widths)
        return taken

    @property
    def size(self) -> int:
        return self.units * self.unit_size


@dataclasses.dataclass(frozen=True)
class ShardRule:
    """How one parameter splits: along `axis`, which holds `segments` one after the other; no
    segments: the whole parameter on every shard (norm weights, routers)."""

    axis: int = 0
    segments: tuple[Segment, ...] = ()

    def take(self, full: np.ndarray, shard: int, shards: int) -> np.ndarray:
        """Shard `shard`'s slice of the whole parameter `full` (host arrays)."""
        if not self.segments:
            return full
        sizes = [s.size for s in self.segments]
        if sum(sizes) != full.shape[self.axis]:
            raise ValueError(f"segments {sizes} do not cover axis {self.axis} of {full.shape}")
        parts = np.split(full, np.cumsum(sizes)[:-1], axis=self.axis)
        taken = [
            s.take(p, shard, shards, self.axis) for s, p in zip(self.segments, parts, strict=True)
        ]
        return np.concatenate(taken, axis=self.axis)

    def spans(self, shard: int, shards: int) -> list[tuple[int, int, int]]:
        """Shard `shard`'s (start, stop, pad) runs along `axis` of the whole parameter, segment
        by segment: its slice is the concatenation of whole[start:stop] each followed by `pad`
        zeros (what `take` gives, for a reader that reads only those entries)."""
        runs, offset = [], 0
        for segment in self.segments:
            start, stop, pad = segment.span(shard, shards)
            runs.append((offset + start, offset + stop, pad))
            offset += segment.size
        return runs


REPLICATED = ShardRule()


def split(axis: int, *segments: Segment) -> ShardRule:
    """The rule of a parameter whose `axis` holds `segments`."""
    return ShardRule(axis, segments)
