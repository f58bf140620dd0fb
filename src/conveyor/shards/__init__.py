"""Packed shards: tar files in the WebDataset layout, with an index for
random access (``conveyor pack`` writes them; ``ShardDataset`` reads them,
and shards the ``webdataset`` package wrote). Every read is checked against
the tar, its index and the folder's manifest; a disagreement raises
``ShardError``."""

from .dataset import ShardDataset, ShardStream
from .errors import ShardError
from .index import ShardIndex
from .manifest import shard_paths
from .records import decode_member, encode_sample

__all__ = ["ShardDataset", "ShardStream", "ShardIndex", "ShardError", "shard_paths", "encode_sample", "decode_member"]
