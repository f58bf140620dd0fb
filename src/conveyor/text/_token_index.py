"""The record of a token-files folder: what ``index.json`` says, and the checks
that tie it to ``tokens.bin`` and ``offsets.bin``.

    folder/tokens.bin    every document's tokens, one after another (raw little-endian uint16 or uint32)
    folder/offsets.bin   documents + 1 int64 (little-endian): document d is tokens[offsets[d]:offsets[d + 1]]
    folder/index.json    the record: format, version, dtype, documents, tokens, vocab_size,
                         each file's size in bytes and CRC-32 (written last: it marks the folder finished)

Opening checks the record and its ties without reading ``tokens.bin``: the
header's keys and values, each file's size against a stat, ``offsets.bin``'s
CRC-32 and its offsets (0 first, never decreasing, ``tokens`` last).
``tokens.bin``'s CRC-32 is compared only when asked (``verify=True``): it reads
the whole file.
"""

from __future__ import annotations

import json
import os
import zlib
from dataclasses import dataclass
from typing import Any, Optional

import numpy as np

TOKENS_NAME = "tokens.bin"
OFFSETS_NAME = "offsets.bin"
INDEX_NAME = "index.json"
#: The files of one corpus, in the order a write renames them into place (the index last).
FILE_NAMES = (TOKENS_NAME, OFFSETS_NAME, INDEX_NAME)
FORMAT = "conveyor-token-files"
#: Written into each index.json; another one was written by another conveyor.
VERSION = 1
#: The token dtypes a corpus can hold (little-endian on disk).
DTYPES: dict[str, np.dtype[Any]] = {"uint16": np.dtype("<u2"), "uint32": np.dtype("<u4")}
OFFSET_DTYPE: np.dtype[Any] = np.dtype("<i8")
#: Bytes read at a time to compute a CRC-32 (memory against the number of reads).
_CRC_CHUNK_BYTES = 16 << 20

_WRITE_HINT = "write the corpus again with conveyor.TokenFiles.write(folder, documents, overwrite=True)"
_KEYS = (
    "format",
    "version",
    "dtype",
    "documents",
    "tokens",
    "vocab_size",
    "tokens_bytes",
    "tokens_crc32",
    "offsets_bytes",
    "offsets_crc32",
)


class TokenFilesError(ValueError):
    """A token-files folder whose files disagree with its ``index.json`` (a
    truncated or changed ``tokens.bin``, the index of another corpus, an
    unsupported version, offsets that are not a document index). The message
    names the file, what disagrees and what to do.

    A ``ValueError``, so code that catches bad input keeps working.
    """


@dataclass(frozen=True)
class TokenIndex:
    """What ``index.json`` records: ``documents`` documents of ``tokens``
    tokens in all, each a ``dtype`` (a name in ``DTYPES``), ids below
    ``vocab_size`` when one was given; each file's size in bytes and CRC-32."""

    dtype: str
    documents: int
    tokens: int
    vocab_size: Optional[int]
    tokens_bytes: int
    tokens_crc32: int
    offsets_bytes: int
    offsets_crc32: int

    def to_json(self) -> dict[str, Any]:
        """The record as index.json holds it (format and version first)."""
        fields = {key: getattr(self, key) for key in _KEYS[2:]}
        return {"format": FORMAT, "version": VERSION, **fields}


def crc32_of_file(path: str) -> int:
    """The CRC-32 of a whole file, read in chunks of ``_CRC_CHUNK_BYTES``."""
    crc = 0
    with open(path, "rb") as file:
        while chunk := file.read(_CRC_CHUNK_BYTES):
            crc = zlib.crc32(chunk, crc)
    return crc


def read_index(folder: str) -> TokenIndex:
    """The record of ``folder``, its keys and values checked (not yet its files)."""
    path = os.path.join(folder, INDEX_NAME)
    if not os.path.exists(path):
        present = [name for name in FILE_NAMES if os.path.exists(os.path.join(folder, name))]
        if not os.path.isdir(folder):
            what = "is a file, not a folder" if os.path.exists(folder) else "does not exist"
            raise FileNotFoundError(
                f"no token files at {folder!r}: the folder {what} (write them with "
                f"conveyor.TokenFiles.write(folder, documents))"
            )
        if present:
            raise TokenFilesError(
                f"{folder!r} holds {', '.join(present)} but no {INDEX_NAME}: a write that did not finish "
                f"(the index is renamed into place last); {_WRITE_HINT}"
            )
        raise FileNotFoundError(
            f"no token files in {folder!r} (no {INDEX_NAME}): write them with "
            f"conveyor.TokenFiles.write(folder, documents)"
        )
    try:
        with open(path, "rb") as file:
            record = json.loads(file.read())
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TokenFilesError(f"{path} is not JSON ({error}); {_WRITE_HINT}") from error
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise TokenFilesError(
            f'{path} is not the index of conveyor token files (no "format": {FORMAT!r}); {_WRITE_HINT}'
        )
    if record.get("version") != VERSION:
        raise TokenFilesError(
            f"{path} is format version {record.get('version')!r}; this conveyor reads version {VERSION} "
            f"(a newer version: upgrade conveyor; an older one: {_WRITE_HINT})"
        )
    missing = [key for key in _KEYS if key not in record]
    if missing:
        raise TokenFilesError(f"{path} lacks {', '.join(missing)}; {_WRITE_HINT}")
    if record["dtype"] not in DTYPES:
        raise TokenFilesError(
            f"{path} records dtype {record['dtype']!r}; token files hold {' or '.join(DTYPES)}; {_WRITE_HINT}"
        )
    for key in _KEYS[3:]:
        value = record[key]
        if key == "vocab_size" and value is None:
            continue
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise TokenFilesError(f"{path}: {key} should be a non-negative int, got {value!r}; {_WRITE_HINT}")
    index = TokenIndex(**{key: record[key] for key in _KEYS[2:]})
    itemsize = DTYPES[index.dtype].itemsize
    if index.tokens_bytes != index.tokens * itemsize or index.offsets_bytes != (index.documents + 1) * 8:
        raise TokenFilesError(
            f"{path} disagrees with itself: {index.tokens} tokens of {index.dtype} are not {index.tokens_bytes} "
            f"bytes, or {index.documents} documents' offsets not {index.offsets_bytes} bytes; {_WRITE_HINT}"
        )
    return index


def check_size(folder: str, name: str, recorded: int) -> None:
    """Raise unless ``folder/name`` is ``recorded`` bytes (a stat)."""
    path = os.path.join(folder, name)
    try:
        size = os.stat(path).st_size
    except FileNotFoundError:
        raise TokenFilesError(f"{path} is missing; {INDEX_NAME} records {recorded} bytes; {_WRITE_HINT}") from None
    if size != recorded:
        what = "truncated" if size < recorded else "longer than its record"
        raise TokenFilesError(
            f"{path} is {size} bytes but {INDEX_NAME} records {recorded} ({what}: a changed or truncated "
            f"file, or the index of another corpus); restore the folder's files as written, or {_WRITE_HINT}"
        )


def check_offsets(folder: str, index: TokenIndex, offsets: np.ndarray) -> None:
    """Raise unless ``offsets`` (read from offsets.bin) is the document index
    its record describes: its CRC-32, 0 first, never decreasing, ``tokens`` last."""
    path = os.path.join(folder, OFFSETS_NAME)
    crc = zlib.crc32(offsets.data)
    if crc != index.offsets_crc32:
        raise TokenFilesError(
            f"{path} has CRC-32 {crc:#010x} but {INDEX_NAME} records {index.offsets_crc32:#010x} (a changed "
            f"offsets file, or the index of another corpus); {_WRITE_HINT}"
        )
    bad = _first_bad_offset(offsets, index.tokens)
    if bad is not None:
        raise TokenFilesError(f"{path} is not a document index: {bad}; {_WRITE_HINT}")


def _first_bad_offset(offsets: np.ndarray, tokens: int) -> Optional[str]:
    """What is wrong with the first bad offset, or None for a good index."""
    if int(offsets[0]) != 0:
        return f"document 0 starts at {int(offsets[0])}, not 0"
    negative = np.flatnonzero(offsets < 0)
    if negative.size:
        return f"document {int(negative[0])} starts at {int(offsets[negative[0]])} (negative)"
    past = np.flatnonzero(offsets > tokens)
    if past.size:
        return f"document {int(past[0]) - 1} ends at {int(offsets[past[0]])}, past the {tokens} tokens"
    falling = np.flatnonzero(offsets[1:] < offsets[:-1])
    if falling.size:
        d = int(falling[0])
        return f"document {d} ends at {int(offsets[d + 1])}, before it starts at {int(offsets[d])}"
    if int(offsets[-1]) != tokens:
        return f"the last document ends at {int(offsets[-1])}, not at the {tokens} tokens"
    return None


def check_tokens(folder: str, index: TokenIndex) -> None:
    """Raise unless tokens.bin's CRC-32 is its record's (reads the whole file)."""
    path = os.path.join(folder, TOKENS_NAME)
    crc = crc32_of_file(path)
    if crc != index.tokens_crc32:
        raise TokenFilesError(
            f"{path} has CRC-32 {crc:#010x} but {INDEX_NAME} records {index.tokens_crc32:#010x} (its "
            f"contents changed since it was written, or the index is another corpus's); restore the file "
            f"as written, or {_WRITE_HINT}"
        )
