"""Samples as tar members, in the WebDataset layout, and the index that
finds them again without reading the tar.

    sample {"jpg": b"...", "cls": 3} ──encode──▶ members ("000042.jpg", b"..."), ("000042.cls", b"3")
    members ──write_sample──▶ tar (USTAR: a 512-byte header, the data padded to 512)
    tar ──scan──▶ ShardIndex (index.py): per sample its key, per member its extension, offset and size

A sample's members share a key (the name up to the first dot of its last
path part) and follow one another; the extension (after that dot) says how
its bytes decode: ``cls``/``idx``/``id`` an int, ``txt`` text, ``json``
JSON, ``npy`` a numpy array; anything else (``jpg``, ``png``, ``flac``...)
stays bytes for the user to decode. This is what the ``webdataset``
package writes and reads, so shards go both ways.
"""

from __future__ import annotations

import io
import json
import numbers
import tarfile
from typing import Any, Iterable

import numpy as np

#: Tar blocks: each header, and each member's data rounded up to it.
BLOCK = 512
#: Extensions decoded to ints, text, JSON, arrays.
_INT_EXTS = ("cls", "idx", "id", "index")
_TEXT_EXTS = ("txt", "text")


def tar_bytes(sizes: Iterable[int]) -> int:
    """Bytes the members of these sizes take in a tar (headers and padding)."""
    return sum(BLOCK + -(-size // BLOCK) * BLOCK for size in sizes)


# ------------------------------------------------------------------ encoding
def encode_value(value: Any) -> tuple[str, bytes]:
    """(extension, bytes) for one value of a sample whose field has no
    extension of its own: bytes stay bytes (``bin``), ints are ``cls``,
    floats and text ``txt``, arrays (numpy or torch) ``npy``, dicts and
    lists ``json``."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bin", bytes(value)
    if isinstance(value, bool) or isinstance(value, numbers.Integral):
        return "cls", str(int(value)).encode()
    if isinstance(value, numbers.Real):
        return "txt", repr(float(value)).encode()
    if isinstance(value, str):
        return "txt", value.encode()
    if hasattr(value, "numpy") and callable(value.numpy):  # a torch tensor
        value = value.detach().cpu().numpy() if hasattr(value, "detach") else value.numpy()
    if isinstance(value, np.ndarray) or isinstance(value, np.generic):
        buffer = io.BytesIO()
        np.save(buffer, np.asarray(value), allow_pickle=False)
        return "npy", buffer.getvalue()
    if isinstance(value, (dict, list, tuple)):
        return "json", json.dumps(value).encode()
    raise TypeError(
        f"cannot store a {type(value).__name__} in a shard; return bytes, str, numbers, numpy arrays, "
        f"torch tensors, or dicts/lists of plain values"
    )


def encode_field(ext: str, value: Any) -> bytes:
    """A value under a named extension: bytes as they are, else as its extension says."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    kind, data = encode_value(value)
    if ext.rsplit(".", 1)[-1] in _INT_EXTS + _TEXT_EXTS + ("json", "npy") or kind in ("npy", "json"):
        return data
    raise TypeError(f"field {ext!r} holds a {type(value).__name__}; give it as bytes")


def encode_sample(sample: Any) -> list[tuple[str, bytes]]:
    """A sample's members as (extension, bytes): a dict's keys are the
    extensions (``{"jpg": b"...", "cls": 3}``); a tuple's or list's items are
    numbered (``0.npy``, ``1.cls``); anything else is one member."""
    if isinstance(sample, dict):
        members = [
            (str(ext), encode_field(str(ext), value)) for ext, value in sample.items() if not str(ext).startswith("__")
        ]
    elif isinstance(sample, (tuple, list)):
        members = []
        for position, value in enumerate(sample):
            ext, data = encode_value(value)
            members.append((f"{position}.{ext}", data))
    else:
        ext, data = encode_value(sample)
        members = [(ext, data)]
    for ext, _ in members:
        if not ext or "/" in ext or len(ext) > 60:
            raise ValueError(f"{ext!r} cannot be a shard member's extension (a short name without '/')")
    return members


def decode_member(ext: str, data: Any) -> Any:
    """One member's value by its extension (the last part after a dot)."""
    kind = ext.rsplit(".", 1)[-1].lower()
    if kind in _INT_EXTS:
        return int(bytes(data))
    if kind in _TEXT_EXTS:
        return bytes(data).decode()
    if kind == "json":
        return json.loads(bytes(data))
    if kind == "npy":
        return np.load(io.BytesIO(data), allow_pickle=False)
    return bytes(data)


# ------------------------------------------------------------------- writing
def write_sample(tar: tarfile.TarFile, key: str, members: list[tuple[str, bytes]]) -> list[tuple[str, int, int]]:
    """Append a sample's members to ``tar`` (deterministic headers: no
    time, owner or mode of this machine); (extension, data offset, size) of each."""
    placed = []
    for ext, data in members:
        info = tarfile.TarInfo(f"{key}.{ext}")
        info.size, info.mtime, info.mode, info.uname, info.gname = len(data), 0, 0o444, "", ""
        offset = tar.offset + BLOCK  # (a USTAR header is one block: names are kept under 100 characters)
        tar.addfile(info, io.BytesIO(data))
        placed.append((ext, offset, len(data)))
    return placed


def open_shard_writer(path: str) -> tarfile.TarFile:
    """A new tar at ``path`` in the USTAR format (what write_sample expects)."""
    return tarfile.open(path, "w", format=tarfile.USTAR_FORMAT)
