"""Text at pre-training scale: tokenized corpora on disk.

* :class:`TokenFiles` — a folder of flat token files (``tokens.bin``,
  ``offsets.bin``, ``index.json``: the layout of nanoGPT and Megatron-style
  indexed datasets) as a map-style dataset of documents, written by
  ``TokenFiles.write``;
* :class:`TokenFilesError` — a folder whose files disagree with its index.

They live in _token_files.py (the dataset), _token_write.py (writing) and
_token_index.py (the record and its checks).
"""

from __future__ import annotations

from ._token_files import TokenFiles
from ._token_index import TokenFilesError, TokenIndex

__all__ = ["TokenFiles", "TokenFilesError", "TokenIndex"]
