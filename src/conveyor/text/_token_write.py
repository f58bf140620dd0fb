"""Writing token files: any iterable of documents streamed into a folder,
checked id by id, renamed into place only once whole.

    documents ──each checked (_as_tokens): 1-D, integers, 0 ≤ id < limit──▶ .tokens.bin.<pid>.<tag>.tmp
                                                    its end offset ──▶ .offsets.bin.<pid>.<tag>.tmp
    end of documents ──▶ .index.json.<pid>.<tag>.tmp (sizes and CRC-32s, computed as written)
                     ──fsync, then rename: tokens.bin, offsets.bin, index.json last──▶ a corpus

Until ``index.json`` is renamed into place the folder holds no new corpus;
any error (or KeyboardInterrupt) on the way removes the temporary files, so
a write that fails before the renames leaves the folder as it was (with
``overwrite=True``, the old corpus too). The renames replace an old corpus
with its index removed first: one stopped among them leaves a folder that
does not open (no index.json: "a write that did not finish"), never old
files paired with new ones.
"""

from __future__ import annotations

import json
import operator
import os
import secrets
import struct
import zlib
from typing import Any, Iterable, Optional, Union

import numpy as np

from ._token_index import DTYPES, FILE_NAMES, INDEX_NAME, OFFSETS_NAME, TOKENS_NAME, TokenIndex

_OFFSET = struct.Struct("<q")


def token_dtype(dtype: Union[str, np.dtype, type]) -> str:
    """``dtype`` as the name of a token dtype (``"uint16"`` or ``"uint32"``)."""
    try:
        resolved = np.dtype(dtype)
    except TypeError:
        resolved = None
    for name, stored in DTYPES.items():
        if resolved is not None and resolved.kind == "u" and resolved.itemsize == stored.itemsize:
            return name
    raise TypeError(f"dtype should be 'uint16' (a vocabulary of up to 65536 ids) or 'uint32', got {dtype!r}")


def _vocab_limit(vocab_size: Optional[int], dtype: str) -> int:
    """The first id not allowed: ``vocab_size``, or the dtype's range."""
    fits = int(np.iinfo(DTYPES[dtype]).max) + 1
    if vocab_size is None:
        return fits
    if isinstance(vocab_size, bool):
        raise TypeError(f"vocab_size should be an int or None, got {vocab_size!r}")
    try:
        size = operator.index(vocab_size)
    except TypeError:
        raise TypeError(f"vocab_size should be an int or None, got {vocab_size!r}") from None
    if size <= 0:
        raise ValueError(f"vocab_size should be > 0, got {size}")
    if size > fits:
        raise ValueError(f"vocab_size {size} does not fit {dtype} (ids below {fits}): write with dtype='uint32'")
    return size


def _as_tokens(d: int, document: Any, dtype: str, limit: int, vocab_size: Optional[int]) -> np.ndarray:
    """Document ``d`` as a little-endian array of ``dtype``, or a clear error."""
    if isinstance(document, (str, bytes)):
        raise TypeError(f"document {d} is a {type(document).__name__}, not token ids: tokenize it first")
    try:
        array = np.asarray(document)
    except (TypeError, ValueError, OverflowError) as error:
        raise TypeError(f"document {d} is not a sequence of token ids ({error})") from None
    if array.ndim != 1:
        if array.ndim == 0:
            raise TypeError(f"document {d} is a {type(document).__name__} scalar; a document is a 1-D sequence of ids")
        raise TypeError(
            f"document {d} is {array.ndim}-D (shape {array.shape}); a document is a 1-D sequence of token ids: "
            f"write each row as a document, or flatten it"
        )
    if array.size == 0:
        return np.empty(0, DTYPES[dtype])
    if array.dtype.kind not in "iu":
        raise TypeError(
            f"document {d} holds {array.dtype} values, not integers: token ids are ints (for whole numbers "
            f"stored as floats, convert with .astype(np.int64))"
        )
    low = int(array.min())
    if low < 0:
        raise ValueError(f"document {d} has token id {low} at position {int(array.argmin())}: token ids are ≥ 0")
    high = int(array.max())
    if high >= limit:
        where = f"document {d} has token id {high} at position {int(array.argmax())}"
        if vocab_size is not None:
            raise ValueError(f"{where}, not below vocab_size {vocab_size}")
        raise ValueError(f"{where}, which does not fit {dtype} (ids below {limit}): write with dtype='uint32'")
    return array.astype(DTYPES[dtype], copy=False)


def write_token_files(
    folder: Union[str, os.PathLike[str]],
    documents: Iterable[Any],
    dtype: Union[str, np.dtype, type] = "uint16",
    *,
    vocab_size: Optional[int] = None,
    overwrite: bool = False,
) -> TokenIndex:
    """Write ``documents`` into ``folder`` (see ``TokenFiles.write``); the record written."""
    name = token_dtype(dtype)
    limit = _vocab_limit(vocab_size, name)
    if not isinstance(overwrite, bool):
        raise TypeError(f"overwrite should be True or False, got {overwrite!r}")
    try:
        stream = iter(documents)
    except TypeError:
        raise TypeError(
            f"documents should be an iterable of documents (lists or 1-D arrays of token ids), got "
            f"{type(documents).__name__}"
        ) from None
    path = os.path.abspath(os.fspath(folder))
    created = not os.path.exists(path)
    os.makedirs(path, exist_ok=True)
    present = [file for file in FILE_NAMES if os.path.exists(os.path.join(path, file))]
    if present and not overwrite:
        raise FileExistsError(
            f"{path} already holds token files ({', '.join(present)}): pass overwrite=True to replace them, "
            f"or write into another folder"
        )
    tag = f"{os.getpid()}.{secrets.token_hex(4)}"
    temporary = {file: os.path.join(path, f".{file}.{tag}.tmp") for file in FILE_NAMES}
    try:
        index = _write_temporary(temporary, stream, name, limit, vocab_size)
        _rename_into_place(path, temporary)
    except BaseException:
        for temp in temporary.values():
            if os.path.exists(temp):
                os.remove(temp)
        if created and not os.listdir(path):
            os.rmdir(path)  # (a folder this write made, left as it was: absent)
        raise
    return index


def _write_temporary(
    temporary: dict[str, str], stream: Any, dtype: str, limit: int, vocab_size: Optional[int]
) -> TokenIndex:
    """Write the three files under their temporary names; the record."""
    tokens = documents = tokens_crc = 0
    first = _OFFSET.pack(0)
    offsets_crc = zlib.crc32(first)
    with open(temporary[TOKENS_NAME], "wb") as token_file, open(temporary[OFFSETS_NAME], "wb") as offset_file:
        offset_file.write(first)
        for d, document in enumerate(stream):
            data = _as_tokens(d, document, dtype, limit, vocab_size).tobytes()
            token_file.write(data)
            tokens_crc = zlib.crc32(data, tokens_crc)
            tokens += len(data) // DTYPES[dtype].itemsize
            end = _OFFSET.pack(tokens)
            offset_file.write(end)
            offsets_crc = zlib.crc32(end, offsets_crc)
            documents = d + 1
        for file in (token_file, offset_file):
            file.flush()
            os.fsync(file.fileno())
    index = TokenIndex(
        dtype=dtype,
        documents=documents,
        tokens=tokens,
        vocab_size=vocab_size,
        tokens_bytes=tokens * DTYPES[dtype].itemsize,
        tokens_crc32=tokens_crc,
        offsets_bytes=(documents + 1) * _OFFSET.size,
        offsets_crc32=offsets_crc,
    )
    with open(temporary[INDEX_NAME], "w") as index_file:
        json.dump(index.to_json(), index_file, indent=1)
        index_file.write("\n")
        index_file.flush()
        os.fsync(index_file.fileno())
    return index


def _rename_into_place(path: str, temporary: dict[str, str]) -> None:
    """Rename the files into place, the index last (an old index is removed
    first, so the folder never pairs it with the new files)."""
    old_index = os.path.join(path, INDEX_NAME)
    if os.path.exists(old_index):
        os.remove(old_index)
    for file in FILE_NAMES:
        os.replace(temporary[file], os.path.join(path, file))
    try:
        descriptor = os.open(path, os.O_RDONLY)
    except OSError:  # (a platform that cannot open a folder: the renames are made, not yet synced)
        return
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
