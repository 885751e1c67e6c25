"""The speculation suite: what drafting gains and costs, and what its steps cost on the device.

Benches: `spec_decode` (tokens/s and acceptance with and without drafts), `draft_prefix` (what a
prefix hit costs a draft-model drafter), `mtp_step` (device time of a decode step without an MTP
head, with one that drafts nothing, and with one that drafts). Parts: the drafters and methods
(`drafters`), the workloads and how they are served and timed (`serving`).

    python -m benchmarks.speculation --help
"""
