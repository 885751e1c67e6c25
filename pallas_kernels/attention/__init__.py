"""Paged attention: causal softmax attention of ragged queries over a KV cache stored in blocks
(block 0 the NULL block), each row reading the blocks of its block table.

`reference.py` holds the plain jnp: the ragged reference `paged_attention_reference` (it gathers
every query's whole row of keys), its decode-lane form `paged_decode_attention_reference`, the
input checks, and `write_kv`, the KV scatter. `decode.py` is the decode op
`paged_decode_attention`, a kernel that reads only each row's own blocks, split over long
contexts; `prefill.py` is the prefill op `paged_prefill_attention`, a flash-attention kernel over
tiles of one row's tokens that reads only that row's keys up to the tile's last position. Both
walk the keys with `key_tiles.py`, one step of flash attention over the paged cache.
"""
