"""Packed shards: tar files in the WebDataset layout, with an index for
random access (``conveyor pack`` writes them; ``ShardDataset`` reads them,
and shards the ``webdataset`` package wrote)."""

from .dataset import ShardDataset, ShardStream, shard_paths
from .records import ShardIndex, decode_member, encode_sample

__all__ = ["ShardDataset", "ShardStream", "ShardIndex", "shard_paths", "encode_sample", "decode_member"]
