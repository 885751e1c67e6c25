"""How `EngineArgs` resolves prefix caching: the state block size, the mode in force and the
state slots it may hold, and the cache events that need it (`EngineArgs.resolved` calls these
once; `EngineArgs.__post_init__` checks the fields that need no model)."""

from __future__ import annotations

import math
from typing import Any, Protocol

from runtime.core import checks
from runtime.core.config import PREFIX_CACHING_MODES
from runtime.core.kv_events_config import KVEventsConfig
from runtime.core.speculative_config import SpeculativeConfig, default_num_slots


class CachingFields(Protocol):
    """The fields of `runtime.core.engine_args.EngineArgs` that prefix caching reads."""

    @property
    def prefix_caching(self) -> str | None: ...
    @property
    def block_size(self) -> int: ...
    @property
    def state_block_size(self) -> int | None: ...
    @property
    def max_cached_states(self) -> int | None: ...
    @property
    def num_slots(self) -> int | None: ...
    @property
    def max_num_seqs(self) -> int: ...
    @property
    def speculative_config(self) -> SpeculativeConfig | None: ...
    @property
    def kv_events_config(self) -> KVEventsConfig | dict[str, Any] | str | None: ...


# The mode args that name none get, where they can cache (`EngineArgs.resolved`); why "all":
# docs/architecture.md, "Prefix caching".
DEFAULT_PREFIX_CACHING = "all"
# The smallest derived state budget: "all" writes a state per state block of every prompt, and a
# request's own deeper states would push a shared one out of a budget of one or two.
DEFAULT_MIN_CACHED_STATES = 16


def state_block_size(args: CachingFields, chunk_size: int) -> int:
    """state_block_size, or the finest possible: lcm(chunk_size, block_size)."""
    unit = math.lcm(chunk_size, args.block_size)
    sbs = args.state_block_size or unit
    if sbs % chunk_size:
        smaller = " (it is shorter than one chunk)" if sbs < chunk_size else ""
        raise ValueError(
            f"state_block_size={sbs} must be a multiple of the model's chunk_size="
            f"{chunk_size} and of block_size={args.block_size}{smaller}: one of {unit}, "
            f"{2 * unit}, {3 * unit}, ..."
        )
    return sbs


def prefix_caching(args: CachingFields, sbs: int, length: int) -> tuple[str, int]:
    """(the prefix caching mode in force, the state slots it may hold)."""
    cached = _cached_states_if_caching(args)
    problem = _why_caching_cannot_work(args, sbs, cached, length)
    mode = args.prefix_caching
    if mode is None:
        mode = "off" if problem else DEFAULT_PREFIX_CACHING
    elif mode != "off" and problem:
        raise ValueError(f"prefix_caching={mode!r} cannot work: {problem}")
    return mode, 0 if mode == "off" else cached


def check_prefix_caching(args: CachingFields) -> None:
    """The prefix caching fields that need no model: the mode's name, state_block_size a multiple
    of block_size, max_cached_states >= 0 (ValueError naming the field)."""
    mode = args.prefix_caching
    if mode is not None and mode not in PREFIX_CACHING_MODES:
        raise ValueError(f"prefix_caching={mode!r} must be one of {PREFIX_CACHING_MODES}")
    if args.state_block_size is not None:
        sbs = checks.integer("state_block_size", args.state_block_size, low=1)
        if sbs % args.block_size:
            raise ValueError(
                f"state_block_size={sbs} must be a multiple of block_size={args.block_size}: "
                f"one of {args.block_size}, {2 * args.block_size}, ..."
            )
    if args.max_cached_states is not None:
        checks.integer("max_cached_states", args.max_cached_states, low=0)


def _cached_states_if_caching(args: CachingFields) -> int:
    """max_cached_states, else what an explicit num_slots leaves, else the default."""
    if args.max_cached_states is not None:
        return args.max_cached_states
    if args.num_slots is not None:
        running = default_num_slots(args.max_num_seqs, args.speculative_config)
        return max(args.num_slots - running, 0)
    return max(args.max_num_seqs, DEFAULT_MIN_CACHED_STATES)


def _why_caching_cannot_work(args: CachingFields, sbs: int, cached: int, length: int) -> str | None:
    seqs, speculative = args.max_num_seqs, args.speculative_config
    if cached < 1:
        return (
            f"max_cached_states={cached} leaves no state slot to cache in (num_slots="
            f"{args.num_slots} holds only the max_num_seqs={seqs} running requests' "
            "slots + NULL)"
        )
    running = default_num_slots(seqs, speculative)
    if args.num_slots is not None and args.num_slots < running + cached:
        return (
            f"num_slots={args.num_slots} must be >= {running} (NULL and the running "
            f"requests' slots{' and lanes' if speculative else ''}) + "
            f"max_cached_states={cached} = {running + cached}"
        )
    if sbs > length - 2:
        return (
            f"state_block_size={sbs} > max_model_len - 2 = {length - 2}: a "
            "hit leaves the last prompt token to compute, so none could hit"
        )
    return None


def kv_events(args: CachingFields, mode: str) -> KVEventsConfig | None:
    """The cache events config of `args`; ValueError when it publishes and caching is `off`."""
    events = KVEventsConfig.of(args.kv_events_config)
    if events is not None and events.publishes and mode == "off":
        raise ValueError("kv_events_config needs prefix caching, which is off")
    return events
