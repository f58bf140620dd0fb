"""``TokenFiles``: a tokenized corpus on disk as a map-style dataset of
documents, the layout nanoGPT and Megatron-style indexed datasets read.

    TokenFiles.write(folder, documents) ──▶ tokens.bin + offsets.bin + index.json (_token_write.py)
    TokenFiles(folder) ──checks the index (_token_index.py)──▶ len, .lengths, .dtype, .num_tokens
    dataset[d] ──memory maps, opened once per process──▶ tokens[offsets[d]:offsets[d + 1]]

Each process maps the files on its first read (a worker after fork or spawn
maps them anew, after a stat that the files are still the size recorded), so
a ``TokenFiles`` pickles as its folder and record, never its maps. While
mapped, each file holds a file descriptor in that process before Python
3.13 (``mmap`` keeps a duplicate of it; 3.13's ``trackfd=False`` does not).
"""

from __future__ import annotations

import mmap
import operator
import os
import sys
from typing import Any, Iterable, Optional, Union

import numpy as np

from ..dataset import Dataset
from ._token_index import (
    DTYPES,
    OFFSET_DTYPE,
    OFFSETS_NAME,
    TOKENS_NAME,
    TokenIndex,
    check_offsets,
    check_size,
    check_tokens,
    read_index,
)


def _map(path: str, dtype: np.dtype) -> np.ndarray:
    """The file at ``path`` as a read-only array of ``dtype``, memory-mapped
    (``np.frombuffer`` over ``mmap``, as Megatron reads its indexed datasets:
    a plain ndarray, without ``np.memmap``'s cost per item)."""
    with open(path, "rb") as file:
        if os.fstat(file.fileno()).st_size == 0:
            return np.empty(0, dtype)  # (an empty file cannot be mapped)
        # (Python 3.13 can map without keeping a duplicate of the descriptor; before it, each map holds one)
        keep_fd = {"trackfd": False} if sys.version_info >= (3, 13) else {}
        mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ, **keep_fd)
    return np.frombuffer(mapped, dtype=dtype)


class TokenFiles(Dataset[Any]):
    """A folder of token files as a map-style dataset: ``dataset[d]`` is
    document ``d``'s tokens, a 1-D read-only numpy array of the dtype written
    (``uint16`` or ``uint32``: a view of the memory map, copy it to change
    it; through ``conveyor.torch``, an ``int64`` tensor, what embeddings and
    losses take). Documents may be empty (a 0-length array).

    ``len(dataset)`` is the number of documents, ``dataset.lengths`` their
    lengths (int64, from the index: no token is read), ``dataset.num_tokens``
    their sum, ``dataset.dtype`` the tokens' dtype and ``dataset.vocab_size``
    the vocabulary size given when written (or None).

    Opening reads ``index.json`` and ``offsets.bin`` and checks them against
    each other and against ``tokens.bin``'s size, so a truncated token file,
    another corpus's index, an edited or hostile offset and an unsupported
    version are a ``TokenFilesError`` naming the file and what disagrees.
    ``verify=True`` also compares ``tokens.bin``'s CRC-32 with its record: it
    reads the whole file once (a changed token file of the same size is
    caught only so).

    Write a corpus with ``TokenFiles.write(folder, documents, dtype=)``.

    Example::

        docs = conveyor.TokenFiles.write("corpus", [[5, 6, 7], [8, 9]], dtype="uint16")
        docs[1]          # array([8, 9], dtype=uint16)
        docs.lengths     # array([3, 2])
    """

    #: This process's maps (None until first used) and the process that made them.
    _token_map: Optional[np.ndarray]
    _offset_map: Optional[np.ndarray]
    _lengths: Optional[np.ndarray]
    _pid: int

    def __init__(self, folder: Union[str, os.PathLike[str]], *, verify: bool = False) -> None:
        if not isinstance(verify, bool):
            raise TypeError(f"verify should be True or False, got {verify!r}")
        self.folder = os.path.abspath(os.fspath(folder))
        index = self._index = read_index(self.folder)
        check_size(self.folder, TOKENS_NAME, index.tokens_bytes)
        check_size(self.folder, OFFSETS_NAME, index.offsets_bytes)
        self._forget_maps()
        check_offsets(self.folder, index, self._offsets())
        if verify:
            check_tokens(self.folder, index)

    # -- the record ----------------------------------------------------------

    def __len__(self) -> int:
        return self._index.documents

    @property
    def dtype(self) -> np.dtype:
        """The tokens' dtype as written (``uint16`` or ``uint32``)."""
        return np.dtype(self._index.dtype)

    @property
    def num_tokens(self) -> int:
        """The number of tokens of all documents."""
        return self._index.tokens

    @property
    def vocab_size(self) -> Optional[int]:
        """The vocabulary size the write checked ids against, or None."""
        return self._index.vocab_size

    @property
    def offsets(self) -> np.ndarray:
        """``len(self) + 1`` int64 offsets (read-only): document ``d`` is
        tokens ``offsets[d]`` to ``offsets[d + 1]`` of the flat token file."""
        return self._offsets()

    @property
    def lengths(self) -> np.ndarray:
        """Each document's number of tokens (int64), from the index alone."""
        if self._lengths is None or self._pid != os.getpid():
            lengths = np.diff(self._offsets())
            lengths.flags.writeable = False
            self._lengths = lengths
        return self._lengths

    # -- reading -------------------------------------------------------------

    def __getitem__(self, index: Any) -> Any:
        d = self._document(index)
        offsets = self._offsets()
        return self._deliver(self._tokens()[int(offsets[d]) : int(offsets[d + 1])])

    def _document(self, index: Any) -> int:
        """``index`` as a document number, negative ones counted from the end."""
        try:
            d = operator.index(index)
        except TypeError:
            raise TypeError(
                f"TokenFiles indices are ints (a document number), got {type(index).__name__} {index!r}"
            ) from None
        n = self._index.documents
        if not -n <= d < n:
            raise IndexError(f"document {d} is out of range: {self.folder} holds {n} documents")
        return d + n if d < 0 else d

    def _deliver(self, tokens: np.ndarray) -> Any:
        """A document's tokens as this flavour hands them out (numpy here)."""
        return tokens

    def _tokens(self) -> np.ndarray:
        """The token file's map in this process (mapped on first use, after a stat)."""
        if self._token_map is None or self._pid != os.getpid():
            self._remap()
            check_size(self.folder, TOKENS_NAME, self._index.tokens_bytes)
            self._token_map = _map(os.path.join(self.folder, TOKENS_NAME), DTYPES[self._index.dtype])
        return self._token_map

    def _offsets(self) -> np.ndarray:
        """The offsets file's map in this process (mapped on first use, after a stat)."""
        if self._offset_map is None or self._pid != os.getpid():
            self._remap()
            check_size(self.folder, OFFSETS_NAME, self._index.offsets_bytes)
            self._offset_map = _map(os.path.join(self.folder, OFFSETS_NAME), OFFSET_DTYPE)
        return self._offset_map

    def _remap(self) -> None:
        """In a process other than the maps' (a forked worker), forget them all."""
        if self._pid != os.getpid():
            self._forget_maps()

    def _forget_maps(self) -> None:
        self._pid = os.getpid()
        self._token_map = None
        self._offset_map = None
        self._lengths = None

    # -- pickling and writing ------------------------------------------------

    def __getstate__(self) -> dict[str, Any]:
        """The folder and its record; each process maps the files itself."""
        return {"folder": self.folder, "index": self._index}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.folder = state["folder"]
        self._index = state["index"]
        self._forget_maps()  # (each file is mapped on first use, after a stat)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}({self.folder!r}: {len(self)} documents, {self.num_tokens} tokens "
            f"of {self._index.dtype})"
        )

    @classmethod
    def write(
        cls,
        folder: Union[str, os.PathLike[str]],
        documents: Iterable[Any],
        dtype: Union[str, np.dtype, type] = "uint16",
        *,
        vocab_size: Optional[int] = None,
        overwrite: bool = False,
    ) -> TokenFiles:
        """Write ``documents`` (any iterable of 1-D integer sequences: lists,
        numpy arrays, tensors) into ``folder`` as token files and open them.

        Streams: one document is held at a time. Each token id is checked to
        be ≥ 0, to fit ``dtype`` (``"uint16"`` holds ids below 65536,
        ``"uint32"`` below 2**32) and to be below ``vocab_size`` when given;
        a document that is not a 1-D integer sequence, or holds a bad id, is
        an error naming its number. Atomic: the files are written under
        temporary names in ``folder`` and renamed into place at the end
        (``index.json`` last), so a write that fails or is interrupted leaves
        no corpus and no temporary file (a killed process can leave
        ``.*.tmp`` files, never a corpus that opens). A folder that already
        holds token files is refused unless ``overwrite=True``.
        """
        from ._token_write import write_token_files

        write_token_files(folder, documents, dtype, vocab_size=vocab_size, overwrite=overwrite)
        return cls(folder)

    @property
    def index(self) -> TokenIndex:
        """The record ``index.json`` holds (sizes and CRC-32s of the files)."""
        return self._index
