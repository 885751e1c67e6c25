"""`jmamba generate`: generate from the command line (default: a built-in tiny hybrid model)."""

from __future__ import annotations

import argparse
import sys

from runtime.config import DEFAULT_PREFIX_CACHING, PREFIX_CACHING_MODES
from runtime.llm import DEFAULT_MODEL, LLM
from runtime.sampling_params import SamplingParams


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jmamba")
    commands = parser.add_subparsers(dest="command", required=True)
    gen = commands.add_parser("generate", help="generate tokens for one or more prompts")
    gen.add_argument("--model", default=DEFAULT_MODEL, help="preset (tiny-<family>) or HF dir")
    gen.add_argument("--prompt", action="append", help="text prompt (needs tokenizer.json)")
    gen.add_argument("--prompt-ids", action="append", help="comma-separated token ids")
    gen.add_argument("--max-tokens", type=int, default=16)
    gen.add_argument("--min-tokens", type=int, default=0, help="no stop token before this many")
    gen.add_argument("--ignore-eos", action="store_true", help="do not stop at the EOS ids")
    gen.add_argument("--temperature", type=float, default=0.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--max-num-seqs", type=int, default=8)
    gen.add_argument("--max-model-len", type=int, default=256)
    gen.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=None,
        help="token budget per step (default: derived from the model's chunk size)",
    )
    gen.add_argument(
        "--data-parallel-size",
        type=int,
        default=1,
        help="ranks of the data-parallel mesh (one device each; pool sizes are per rank)",
    )
    cache = gen.add_argument_group("prefix caching (per rank)")
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
    multi = gen.add_argument_group(
        "multi-host (every process runs the same command with its own prompts)"
    )
    multi.add_argument("--coordinator-address", help="host:port of process 0")
    multi.add_argument("--num-processes", type=int, default=1)
    multi.add_argument("--process-id", type=int, default=0)
    return parser


def _prompts(args: argparse.Namespace) -> list:
    prompts: list = list(args.prompt or [])
    for text in args.prompt_ids or []:
        try:
            prompts.append([int(t) for t in text.split(",") if t.strip()])
        except ValueError:
            raise ValueError(f"--prompt-ids {text!r} must be comma-separated ints") from None
    return prompts or [[1, 2, 3, 4, 5, 6, 7, 8], [9, 10, 11]]


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.coordinator_address:
            from runtime.distributed import initialize

            initialize(args.coordinator_address, args.num_processes, args.process_id)
        prompts = _prompts(args)
        params = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                                max_tokens=args.max_tokens, min_tokens=args.min_tokens,
                                seed=args.seed, ignore_eos=args.ignore_eos)  # fmt: skip
        llm = LLM(args.model, max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                  max_num_batched_tokens=args.max_num_batched_tokens,
                  data_parallel_size=args.data_parallel_size,
                  prefix_caching=args.prefix_caching, state_block_size=args.state_block_size,
                  max_cached_states=args.max_cached_states, warmup=False)  # fmt: skip
        outputs = llm.generate(prompts, params)
    except ValueError as error:
        print(f"jmamba: error: {error}", file=sys.stderr)
        return 2
    for output in outputs:
        shown = output.text if output.text is not None else output.token_ids
        print(f"[{output.request_id}] {output.finish_reason}: {shown}")
    engine = llm.engine
    print(f"{engine.stats.num_steps} steps, {engine.num_variants} compiled step variants")
    cached = llm.prefix_cache_stats
    if cached is not None:
        print(f"prefix cache ({engine.config.prefix_caching}): {cached.hits}/{cached.lookups} "
              f"requests hit, {cached.hit_tokens}/{cached.lookup_tokens} prompt tokens skipped, "
              f"{cached.block_evictions} block and {cached.state_evictions} state "
              "evictions")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
