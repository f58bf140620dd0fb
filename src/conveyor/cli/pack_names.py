"""Which names ``conveyor pack`` can store, and the words that refuse the
others: decided for a folder's every entry when it is listed, before any
shard is written; for a dataset's fields, as each sample is encoded.

    SRC/<class>/<file>  ──▶ sample i: the file's bytes under its field, its class number under "cls"
        field = the file's extension (after its last dot), lowercased; "bin" when it has none
        member names in the tar: "000000042.<field>" (keys are sample numbers, never file names)

So a file's own name (its stem, spaces, newlines, bytes that are not
UTF-8, any length) never reaches a tar; only its extension does, and its
class folder's name reaches the manifest (JSON, which holds any name). What
cannot be stored exactly is refused, each with what to do:

    a field that is not UTF-8 text, holds '/' or NUL, is empty, or is more
    than MAX_FIELD_BYTES bytes (a tar header holds 100 bytes of key, dot, field)
    a field beginning with "__" (a sample's metadata to ShardDataset and webdataset: __key__, __url__)
    a file whose field is "cls" (the class number's); a dataset's two fields one to webdataset,
        which lowercases every field when it reads
    a file directly in SRC (of no class); a folder inside a class folder (its files would be left out)
    a link to nothing, a loop of links, and what is not a regular file (a FIFO, a socket, a device)

A link leading out of SRC is no name question: it is skipped and listed
(pack_sources.py) unless links are followed.
"""

from __future__ import annotations

import errno
import os
import stat
from typing import Optional

#: The longest field, in bytes of UTF-8: a member's name (a key of 9 or 10 digits, a dot, the field) then stays
#: well inside the 100 bytes of a USTAR header's name field, the one every tar reader reads (no pax headers).
MAX_FIELD_BYTES = 60
#: The field a folder's sample keeps its class number in.
LABEL_FIELD = "cls"

_SPECIAL = (
    (stat.S_ISFIFO, "FIFO"),
    (stat.S_ISSOCK, "socket"),
    (stat.S_ISCHR, "character device"),
    (stat.S_ISBLK, "block device"),
)


def shown(path: str) -> str:
    """``path`` as one line: as it is when it is printable UTF-8 text, else
    its ``repr`` (newlines and bytes that are not UTF-8 escaped)."""
    try:
        path.encode("utf-8")
    except UnicodeEncodeError:
        return repr(path)
    return path if path.isprintable() else repr(path)


def folder_field(name: str) -> str:
    """The field a file's bytes are stored under: its extension, lowercased; ``bin`` when it has none."""
    return os.path.splitext(name)[1].lower().lstrip(".") or "bin"


def field_problem(field: str) -> Optional[str]:
    """Why ``field`` cannot name a member of a shard (words that follow the
    field's name), or None when it can."""
    if not field:
        return "is empty: a field needs a name"
    if "/" in field or "\0" in field:
        return "holds '/' or NUL, which a member's name in a tar cannot"
    if field.startswith("__"):
        return "begins with '__', which marks a sample's metadata (__key__, __url__) to ShardDataset and webdataset"
    try:
        size = len(field.encode("utf-8"))
    except UnicodeEncodeError:
        return "is not UTF-8 text, which tar headers and indexes name fields in"
    if size > MAX_FIELD_BYTES:
        return (
            f"is {size} bytes of UTF-8, more than the {MAX_FIELD_BYTES} a field may be (a tar header holds 100 bytes "
            f"of a member's name: its key, a dot and the field)"
        )
    return None


def fields_problem(fields: list[str]) -> Optional[str]:
    """Why a sample with these fields cannot be stored (its first field
    that cannot, or two that webdataset would read as one), or None."""
    seen: dict[str, str] = {}
    for field in fields:
        problem = field_problem(field)
        if problem is not None:
            return f"field {field!r} {problem}; rename it"
        other = seen.setdefault(field.lower(), field)
        if other != field:
            return (
                f"fields {other!r} and {field!r} are one field to webdataset, which lowercases every field when it "
                f"reads; rename one"
            )
    return None


def entry_problem(entry: os.DirEntry, in_class: bool) -> Optional[str]:
    """Why ``entry`` (an entry of SRC, or with ``in_class`` of a class
    folder) cannot pack, with what to do; None when it packs (a class
    folder, or a file of one). Kinds come from the listing: only an entry
    that is neither a file nor a folder costs a stat."""
    try:
        is_dir, is_file = entry.is_dir(), entry.is_file()
    except OSError:  # (a loop of links, or a link this user may not follow)
        return _not_a_file(entry.path)
    if is_dir:
        if in_class:
            return (
                "a folder inside a class folder, whose files would be left out (conveyor pack takes "
                "SRC/<class>/<file>); move its files up into the class folder, or make it a class (a folder of SRC)"
            )
        return None
    if not is_file:
        return _not_a_file(entry.path)
    if not in_class:
        return "a file directly in SRC, of no class; move it into a class folder (SRC/<class>/<file>) or out of SRC"
    field = folder_field(entry.name)
    if field == LABEL_FIELD:
        return f"its extension {field!r} is the field that holds the class number; rename the file"
    problem = field_problem(field)
    return None if problem is None else f"its extension {field!r} {problem}; rename the file"


def _not_a_file(path: str) -> str:
    """The words for an entry that is neither a folder nor a regular file (followed, when it is a link)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        try:
            return f"a link to nothing (it leads to {shown(os.readlink(path))}); mend it or remove it"
        except OSError:
            return "gone while SRC was listed; run the same command again"
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "a loop of symbolic links; remove it"
        return f"cannot be read ({exc.strerror}); mend it or move it out of SRC"
    kind = next((name for test, name in _SPECIAL if test(mode)), "special file")
    return f"a {kind}, not a regular file; remove it or move it out of SRC"


__all__ = [
    "MAX_FIELD_BYTES",
    "LABEL_FIELD",
    "shown",
    "folder_field",
    "field_problem",
    "fields_problem",
    "entry_problem",
]
