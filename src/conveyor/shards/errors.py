"""The one error of shard reading: a shard, its index or its manifest that
disagrees with itself or with the others."""

from __future__ import annotations


class ShardError(ValueError):
    """A shard (tar), its index (``.idx``) or its folder's ``manifest.json``
    is damaged, stale or malformed. The message names the file, the sample
    or key, what disagrees, and what to do (usually: ``conveyor pack
    --verify FOLDER`` lists every problem; pack again or restore the files).

    A ``ValueError``, so code that catches bad input keeps working; raised
    instead of handing out bytes that were not checked against their record.
    """


VERIFY_HINT = "`conveyor pack --verify FOLDER` lists every problem of a packed folder"
