"""The README's Ray Serve command (port 8000 there; the tests swap in a free one), kept apart
from the test module so the README test reads it without importing Ray."""

COMMAND = (
    "jmamba serve --model tiny-stdlib --ray-replicas 2 --max-num-seqs 2 --max-model-len 512 "
    "--warmup decode --port 8000"
)
