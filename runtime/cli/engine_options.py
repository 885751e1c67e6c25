"""The engine options every `jmamba` command takes (model, budgets, prefix caching, speculative
decoding, multi-host), as argparse groups and as the keyword arguments of `LLM`.

Argument parsing loads no jax: `--help` and argument errors answer at once.
"""

from __future__ import annotations

import argparse
from typing import Any

import jmamba.presets
from jmamba.cache_dtypes import KV_CACHE_ALIASES, KV_CACHE_DTYPES, STATE_DTYPES
from runtime.core.bucket_tables import BUCKET_TABLES
from runtime.core.config import DEFAULT_DECODE_STEPS, MAX_DECODE_STEPS, PREFIX_CACHING_MODES
from runtime.core.kv_events_config import KVEventsConfig
from runtime.core.prefix_caching_args import DEFAULT_PREFIX_CACHING
from runtime.core.speculative_config import METHODS, SpeculativeConfig

PRESETS = [f"tiny-{name}" for name in jmamba.presets.names()]
DEFAULT_MODEL = "tiny-stdlib"


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Appends each option's default to its help, unless the default is None (the help says what
    None means) or the help already names its default."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default is None or "default" in text:
            return text
        return super()._get_help_string(action)


def add_engine_options(
    parser: argparse.ArgumentParser,
    *,
    max_num_seqs: int = 8,
    one_sampler_program: bool = False,
    bucket_table: str = "fine",
) -> None:
    """The model and the engine's budgets, prefix caching, speculative decoding and multi-host
    options (`engine_options` turns them into `LLM`'s keyword arguments); `max_num_seqs`,
    `one_sampler_program` and `bucket_table` are the command's defaults."""
    parser.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"a preset ({', '.join(PRESETS)}), a checkpoint directory or a hub id org/name",
    )
    parser.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16"],
        help="parameter dtype; auto: the checkpoint's",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=[*KV_CACHE_DTYPES, *KV_CACHE_ALIASES],
        help="KV pools' dtype; auto: the model's; fp8 (fp8_e4m3): e4m3 with scale 1.0, half a "
        "bfloat16 block",
    )
    parser.add_argument(
        "--state-dtype",
        default="float32",
        choices=STATE_DTYPES,
        help="Mamba2 SSM and Gated DeltaNet recurrent states' dtype (bfloat16: half their "
        "bytes; the kernels accumulate in float32)",
    )
    parser.add_argument(
        "--batch-invariant",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="products and norms in an order fixed by static shapes: a request's tokens do not "
        "depend on its batch or on speculative lanes, in bfloat16 on the GPU too (slower prefill)",
    )
    budgets = parser.add_argument_group("engine budgets (per data-parallel rank)")
    budgets.add_argument(
        "--max-num-seqs", type=int, default=max_num_seqs, help="most requests in one step"
    )
    budgets.add_argument(
        "--max-model-len",
        type=int,
        default=None,
        help="longest prompt + output of a request (default: the checkpoint's "
        "max_position_embeddings)",
    )
    budgets.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="token budget per step (default: from the model's chunk size)",
    )
    budgets.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        help="ranks of the data-parallel mesh (tensor-parallel-size devices each)",
    )
    budgets.add_argument(
        "--tensor-parallel-size",
        type=int,
        default=1,
        help="devices each rank's model is split over (heads, channels, experts, vocabulary)",
    )
    budgets.add_argument(
        "--gpu-memory-utilization",
        type=float,
        default=None,
        help="fraction of each GPU's memory for parameters and pools: sizes the KV blocks "
        "(default: enough blocks for max-num-seqs requests of max-model-len)",
    )
    budgets.add_argument(
        "--async-scheduling",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="schedule each step while the previous one runs on the device (same tokens; "
        "default: on unless ngram or draft-model speculation drafts in every step)",
    )
    budgets.add_argument(
        "--decode-steps",
        type=int,
        default=DEFAULT_DECODE_STEPS,
        help="decode steps one device program runs while every request decodes and none "
        f"waits (same tokens; 1: a program a step; at most {MAX_DECODE_STEPS})",
    )
    budgets.add_argument(
        "--one-sampler-program",
        action=argparse.BooleanOptionalAction,
        default=one_sampler_program,
        help="greedy steps run the temperature sampler's program (same tokens; half the step "
        "programs to compile, 1-4%% of a decode step more on the H100)",
    )
    budgets.add_argument(
        "--bucket-table",
        choices=BUCKET_TABLES,
        default=bucket_table,
        help="padded step sizes: fine (powers of two: least padding, hundreds of programs) or "
        "serving (powers of four: a few dozen programs, every one warmed by --warmup all)",
    )
    _add_prefix_caching(parser)
    _add_speculative(parser)
    _add_multi_host(parser)


def _add_prefix_caching(parser: argparse.ArgumentParser) -> None:
    cache = parser.add_argument_group("prefix caching (per rank)")
    cache.add_argument(
        "--prefix-caching",
        choices=PREFIX_CACHING_MODES,
        default=None,
        help=f"cache KV blocks and recurrent states of prompt prefixes (default: "
        f"{DEFAULT_PREFIX_CACHING} where the config can cache, else off)",
    )
    cache.add_argument(
        "--state-block-size",
        type=int,
        default=None,
        help="tokens per cached recurrent state, a multiple of the chunk and KV block sizes "
        "(default: their least common multiple)",
    )
    cache.add_argument(
        "--max-cached-states",
        type=int,
        default=None,
        help="state slots the cache may hold beside the running requests' (default: "
        "max(max_num_seqs, 16))",
    )
    cache.add_argument(
        "--kv-events-config",
        type=_kv_events_config,
        default=None,
        help="publish each rank's cache events for KV-aware routers, vLLM's JSON: "
        '\'{"enable_kv_cache_events": true, "endpoint": "tcp://*:5557", "topic": "kv-events"}\' '
        "(rank r on the port + r; needs the events extra) (default: no events)",
    )


def _kv_events_config(text: str) -> KVEventsConfig | None:
    """--kv-events-config's JSON as a config (argparse reports a ValueError's message)."""
    try:
        return KVEventsConfig.of(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _add_speculative(parser: argparse.ArgumentParser) -> None:
    spec = parser.add_argument_group("speculative decoding")
    spec.add_argument(
        "--speculative-method",
        choices=METHODS,
        default=None,
        help="propose drafts by prompt lookup (ngram), with a draft model, or with the "
        "checkpoint's MTP head (mtp) (default: none)",
    )
    spec.add_argument("--num-speculative-tokens", type=int, default=3, help="K, drafts per step")
    spec.add_argument("--prompt-lookup-min", type=int, default=2, help="ngram: shortest n-gram")
    spec.add_argument("--prompt-lookup-max", type=int, default=4, help="ngram: longest n-gram")
    spec.add_argument(
        "--draft-model",
        default=None,
        help="draft_model: preset (tiny-<family>) or HF dir with the target's vocabulary",
    )
    spec.add_argument(
        "--speculative-max-batch-size",
        type=int,
        default=None,
        help="ngram / mtp: draft only while no rank runs more requests than this; larger "
        "steps run without drafts (default: draft in every step)",
    )
    spec.add_argument(
        "--speculative-adaptive",
        action="store_true",
        help="ngram / mtp: measure tokens/s with and without drafts at each batch size and "
        "draft where drafting gives more (the other steps run asynchronously)",
    )


def _add_multi_host(parser: argparse.ArgumentParser) -> None:
    multi = parser.add_argument_group(
        "multi-host (every process runs the same command with its own prompts)"
    )
    multi.add_argument(
        "--coordinator-address", default=None, help="host:port of process 0 (default: one host)"
    )
    multi.add_argument("--num-processes", type=int, default=1, help="processes in all")
    multi.add_argument("--process-id", type=int, default=0, help="this process's index")


def speculative_config(args: argparse.Namespace) -> SpeculativeConfig | None:
    """The `SpeculativeConfig` the options ask for (None without `--speculative-method`)."""
    if args.speculative_method is None:
        if args.draft_model is not None:
            raise ValueError("--draft-model needs --speculative-method draft_model")
        return None
    return SpeculativeConfig(
        args.speculative_method,
        args.num_speculative_tokens,
        args.prompt_lookup_min,
        args.prompt_lookup_max,
        args.draft_model,
        args.speculative_max_batch_size,
        args.speculative_adaptive,
    )


def engine_options(args: argparse.Namespace) -> dict[str, Any]:
    """`LLM`'s keyword arguments from the parsed engine options (the model name apart)."""
    return dict(
        dtype=args.dtype,
        max_num_seqs=args.max_num_seqs,
        max_model_len=args.max_model_len,
        max_num_batched_tokens=args.max_num_batched_tokens,
        data_parallel_size=args.data_parallel_size,
        tensor_parallel_size=args.tensor_parallel_size,
        gpu_memory_utilization=args.gpu_memory_utilization,
        prefix_caching=args.prefix_caching,
        state_block_size=args.state_block_size,
        max_cached_states=args.max_cached_states,
        async_scheduling=args.async_scheduling,
        decode_steps=args.decode_steps,
        one_sampler_program=args.one_sampler_program,
        bucket_table=args.bucket_table,
        batch_invariant=args.batch_invariant,
        kv_cache_dtype=args.kv_cache_dtype,
        state_dtype=args.state_dtype,
        speculative=speculative_config(args),
        kv_events_config=args.kv_events_config,
    )


def initialize_multi_host(args: argparse.Namespace) -> None:
    """Join the multi-host run the options name (loads jax; nothing for a single host)."""
    if args.coordinator_address:
        from runtime.device.distributed import initialize  # loads jax: once the options are good

        initialize(args.coordinator_address, args.num_processes, args.process_id)
