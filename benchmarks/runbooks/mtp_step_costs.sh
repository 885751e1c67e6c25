#!/usr/bin/env bash
# Issue 27 on one GPU: what an MTP engine's steps cost against plain ones, in parts.
#
#   benchmarks/runbooks/mtp_step_costs.sh probe      # device ms a decode step: no head / head,
#                                                    # no drafts / drafts (speculation mtp_step)
#   benchmarks/runbooks/mtp_step_costs.sh undrafted  # 0.87B, random head: mtp-1@1, mtp-1@auto, none
#   benchmarks/runbooks/mtp_step_costs.sh trained    # tiny-stdlib's trained head, K = 2, the gate
#
# Each part's log goes to $OUT/<part>.log (its JSON beside it), each command under its own limit.
set -uo pipefail
cd "$(dirname "$0")/../.."
: "${OUT:=/tmp/out}"
mkdir -p "$OUT"
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1 PYTHONPATH="$PWD"

run() {
  local limit=$1
  shift
  echo "### $* (limit ${limit} s)"
  local start=$SECONDS
  timeout "$limit" "$@"
  echo "### status $? after $((SECONDS - start)) s"
}

spec() {  # spec NAME ARGS...: the spec_decode bench, its JSON kept as NAME.json
  run 420 python3 -m benchmarks.speculation spec_decode --async-scheduling "${@:2}"
  mv -f "$OUT/bench_spec_decode.json" "$OUT/$1.json" 2>/dev/null
}

for part in "$@"; do
  case $part in
    probe) run 200 python3 -m benchmarks.speculation mtp_step --size 1b --batches 16,64 ;;
    undrafted) spec undrafted --size 1b --batches 1,16,64 --methods none,mtp-1@1,mtp-1@auto \
      --rounds 5 --requests 16 ;;
    trained) spec trained --size stdlib --batches 1,16,64 --methods none,mtp-2@auto \
      --rounds 3 --requests 16 ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac 2>&1 | tee "$OUT/$part.log"
done
