"""Tensor parallelism's vocabulary for the layers: how a parameter splits over the shards
(`rules`) and the collectives a shard runs (`collectives`)."""
