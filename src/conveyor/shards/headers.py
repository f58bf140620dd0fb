"""The check made at every read: the 512-byte tar header just before a
member's data must be that member's.

    index says: member "000000042.jpg", 8190 bytes at offset 45568
    tar bytes:  [45056 .. 45568) header ── name field  == "000000042.jpg"
                                         ── size field  == 8190
                                         ── checksum    == the header's own byte sum
                [45568 .. 53758) data   ── handed out only when all three hold

An index that is stale, truncated or edited points somewhere else; the
bytes there are not a header naming this member with this size (the data of
another member, or another member's header). The check costs one slice and
a few comparisons; names and sizes in the forms other writers use (a long
name kept in a pax or GNU header before this one, a USTAR prefix, a size too
big for the field) take a slower path that is only reached for such tars.
"""

from __future__ import annotations

import mmap
import zlib
from typing import Optional, Union

from .records import BLOCK

_NAME_FIELD = 100
_SIZE = slice(124, 136)
_CHECKSUM = slice(148, 156)
_MAGIC = slice(257, 262)
_PREFIX = slice(345, 500)
#: A size this big does not fit the header's 11 octal digits: pax writes 0 there and the size in its own header.
_PAX_SIZE = 8**11
#: zlib.adler32's low half is 1 + the sum of the bytes modulo 65521: the tar checksum (a plain sum) in C.
#: A header sums to at most 130,560, so a stored checksum 65521 off the true one would pass the fast path;
#: the name and size must hold too, and any header that fails it is summed exactly on the slow path.
_ADLER_MOD = 65521
_SPACES_SUM = 8 * 0x20  # (the checksum field counts as eight spaces)


def header_problem(data: Union[bytes, mmap.mmap], offset: int, name: str, size: int) -> Optional[str]:
    """What is wrong with the tar header before ``data[offset:]`` as the
    header of member ``name`` of ``size`` bytes; None when it is that member's."""
    header = data[offset - BLOCK : offset] if offset >= BLOCK else b""
    wanted = name.encode("utf-8", "surrogateescape")
    n = len(wanted)
    # The fast path: the forms Python's tarfile, GNU tar and the webdataset package write for short names.
    if len(header) == BLOCK and n < _NAME_FIELD and header[:n] == wanted and header[n] == 0:
        if header[_SIZE] == b"%011o\x00" % size:
            field = header[_CHECKSUM]
            if zlib.adler32(header) & 0xFFFF == (_ADLER_OF_FIELD.get(field) or _adler_for(field)):
                return None
    return _problem(header, offset, len(data), name, wanted, size)


#: Checksum field -> the adler32 low half of a header holding it rightly (a shard's checksums take few
#: values); emptied when full.
_ADLER_OF_FIELD: dict = {}
_ADLER_OF_FIELD_MAX = 4096


def _adler_for(field: bytes) -> int:
    """The low half of zlib.adler32 (1 + the byte sum, modulo 65521) of a
    header whose checksum field is ``field`` and holds the right sum; -1 for
    a field not in the usual form (six octal digits, NUL, space)."""
    if field[6:] != b"\x00 " or not field[:6].isdigit():
        return -1
    value = (1 + int(field[:6], 8) - _SPACES_SUM + sum(field)) % _ADLER_MOD
    if len(_ADLER_OF_FIELD) >= _ADLER_OF_FIELD_MAX:
        _ADLER_OF_FIELD.clear()
    _ADLER_OF_FIELD[field] = value
    return value


def _problem(header: bytes, offset: int, length: int, name: str, wanted: bytes, size: int) -> Optional[str]:
    """The slow path of header_problem: every form, and the words for what is wrong."""
    if len(header) != BLOCK:
        return f"there is no whole tar header before byte {offset} (the data holds {length} bytes)"
    problem = _name_problem(header, name, wanted)
    if problem is not None:
        return problem
    stored = _number(header[_SIZE])
    if stored != size and not (stored == 0 and size >= _PAX_SIZE):
        return f"the tar header there is for {stored} bytes of data, the index says {size}"
    if not _checksum_holds(header):
        return "the tar header there fails its checksum (damaged)"
    return None


def _name_problem(header: bytes, name: str, wanted: bytes) -> Optional[str]:
    stored = header[:_NAME_FIELD].split(b"\x00", 1)[0]
    if stored == wanted:
        return None  # (a name that fills the field)
    if header[_MAGIC] == b"ustar" and header[_PREFIX][:1] != b"\x00":  # (USTAR: a long name split at a '/')
        if header[_PREFIX].split(b"\x00", 1)[0] + b"/" + stored == wanted:
            return None
    if len(stored) == _NAME_FIELD and wanted.startswith(stored):  # (the whole name is in a pax or GNU header before)
        return None
    if stored == name.encode("ascii", "replace")[:_NAME_FIELD]:  # (pax keeps a name that is not ASCII in its own
        return None  # header; this field has '?' for each other character)
    return f"the tar has member {stored.decode('utf-8', 'replace')!r} there, the index says {name!r}"


def _number(field: bytes) -> int:
    """A header's numeric field: octal digits, or base-256 (GNU, for big values); -1 when it is neither."""
    if field[:1] and field[0] & 0x80:
        value = int.from_bytes(field[1:], "big")
        return value - (1 << (8 * len(field) - 8)) if field[0] == 0xFF else value
    try:
        return int(field.split(b"\x00", 1)[0].strip() or b"0", 8)
    except ValueError:
        return -1


def _checksum_holds(header: bytes) -> bool:
    """The stored checksum is the header's unsigned sum, or the signed one some old tar programs wrote."""
    stored = _number(header[_CHECKSUM])
    unsigned = sum(header) - sum(header[_CHECKSUM]) + _SPACES_SUM
    signed = unsigned - 256 * sum(1 for byte in header if byte >= 0x80)
    return stored in (unsigned, signed)
