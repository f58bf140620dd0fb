"""What ``conveyor pack`` reads: a folder of files by class, or a map-style
dataset from ``MODULE:FACTORY``; and its errors.

A folder's symbolic links are followed only while they stay inside it: a
link (to a file or a folder) that leads out of SRC is skipped and listed
in ``skipped``, unless ``follow_links`` is given (a folder of links to data
elsewhere is then packed). A link that stays inside SRC is packed as the
file it leads to. Files are opened without following a link in their last
part (``O_NOFOLLOW``), so a file swapped for a link after the listing is
not read through it.
"""

from __future__ import annotations

import os
from typing import Any

from ..shards.records import encode_sample
from .factory import load_factory
from .pack_names import LABEL_FIELD, entry_problem, fields_problem, folder_field, shown


class PackError(Exception):
    """A source, bound or folder that cannot be packed: printed on one line without traceback, exit status 2."""


class PackFailed(PackError):
    """Packing failed on the way (a full disk, a refused permission, a writing process that died): one line,
    exit status 1; the same command again goes on from the shards already written."""


class FolderSource:
    """``root/<class>/<file>``: sample ``i`` is the file's bytes under its
    extension, and its class number as ``cls``. Links leading out of
    ``root`` are left out (listed in ``skipped``) unless ``follow_links``;
    any other entry that cannot pack (pack_names.py) is a PackError naming it."""

    def __init__(self, root: str, follow_links: bool = False):
        self._inside, self._follow = os.path.realpath(root), follow_links
        self._root = root
        #: Links left out: "cat/key.pem -> /home/me/.ssh/id_rsa".
        self.skipped: list[str] = []
        folders = [entry for entry in _sorted_entries(root) if self._admitted(entry, root, False)]
        for entry in folders:
            _refuse(entry, False)
        self.classes = [entry.name for entry in folders]
        if not self.classes:
            raise PackError(f"{root} has no class folders; expected {root}/<class>/<file>")
        #: (the path to open, its class, its extension) per sample.
        self.files: list[tuple[str, int, str]] = []
        for label, folder in enumerate(folders):
            linked = folder.is_symlink()
            for entry in _sorted_entries(folder.path):
                if self._admitted(entry, root, linked):
                    _refuse(entry, True)
                    path = os.path.realpath(entry.path) if linked or entry.is_symlink() else entry.path
                    self.files.append((path, label, folder_field(entry.name)))
        if not self.files:
            raise PackError(f"no files under {root}/<class>/")
        self.description = f"folder {os.path.abspath(root)}"

    def _admitted(self, entry: os.DirEntry, root: str, in_linked_folder: bool) -> bool:
        """Whether ``entry`` (a class folder or a file) is packed: it is no
        link and in no linked folder, or it leads to a place inside SRC, or links are followed."""
        if not entry.is_symlink() and not in_linked_folder:
            return True
        resolved = os.path.realpath(entry.path)
        if self._follow or resolved == self._inside or resolved.startswith(self._inside + os.sep):
            return True
        self.skipped.append(f"{os.path.relpath(entry.path, root)} -> {resolved}")
        return False

    def __len__(self) -> int:
        return len(self.files)

    def members(self, i: int) -> list[tuple[str, bytes]]:
        path, label, ext = self.files[i]
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "rb") as f:
            data = f.read()
        return [(ext, data), (LABEL_FIELD, str(label).encode())]

    def sizes(self, i: int) -> list[int]:
        path, label, _ = self.files[i]
        return [os.path.getsize(path), len(str(label))]

    def identity(self, i: int) -> dict:
        """What tells sample ``i`` without reading it (its file's path in SRC,
        class, size, modification time): what a re-pack compares (pack_fresh.py)."""
        path, label, _ = self.files[i]
        st = os.stat(path)
        return {"file": os.path.relpath(path, self._root), "cls": label, "size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _refuse(entry: os.DirEntry, in_class: bool) -> None:
    """A PackError naming ``entry`` unless it can pack (pack_names.py)."""
    problem = entry_problem(entry, in_class)
    if problem is not None:
        raise PackError(f"{shown(entry.path)}: {problem}")


def _sorted_entries(folder: str) -> list[os.DirEntry]:
    """A folder's entries by name (their kinds come with the listing: no stat each)."""
    with os.scandir(folder) as entries:
        return sorted(entries, key=lambda entry: entry.name)


class DatasetSource:
    """A map-style dataset from ``MODULE:FACTORY``: sample ``i`` encoded by
    records.encode_sample (a dict's keys are the extensions)."""

    def __init__(self, spec: str):
        dataset = load_factory(spec, "a map-style dataset")()
        if not (hasattr(dataset, "__len__") and hasattr(dataset, "__getitem__")):
            raise PackError(
                f"{spec} returned a {type(dataset).__name__}; conveyor pack needs a map-style dataset (len and [])"
            )
        self.dataset, self.classes, self.description = dataset, None, f"factory {spec}"
        self.skipped: list[str] = []

    def __len__(self) -> int:
        return len(self.dataset)

    def members(self, i: int) -> list[tuple[str, bytes]]:
        """Sample ``i`` encoded; a field or value that cannot be stored is a PackError naming the sample."""
        sample = self.dataset[i]
        try:
            members = encode_sample(sample)
        except (TypeError, ValueError) as exc:
            raise PackError(f"sample {i} of {self.description}: {exc}") from None
        problem = fields_problem([field for field, _ in members])
        if problem is not None:
            raise PackError(f"sample {i} of {self.description}: {problem}")
        return members

    def sizes(self, i: int) -> list[int]:
        return [len(data) for _, data in self.members(i)]

    def identity(self, i: int) -> dict:
        """Nothing tells a dataset's sample but its bytes: a re-pack compares their digests (pack_fresh.py)."""
        return {}


class ReencodedSource:
    """Another source with its images stored smaller (``--max-side``:
    conveyor.images.reencode). Measuring a sample (for ``--max-bytes``)
    re-encodes it too."""

    def __init__(self, source: Any, reencode: Any):
        self.source, self.reencode = source, reencode
        self.classes, self.skipped = source.classes, source.skipped
        self.description = f"{source.description}, {reencode.describe()}"

    def __len__(self) -> int:
        return len(self.source)

    def members(self, i: int) -> list[tuple[str, bytes]]:
        try:
            return self.reencode.members(self.source.members(i))
        except (OSError, PackError):
            raise
        except Exception as exc:  # (Pillow's errors for a damaged image)
            raise PackFailed(f"cannot re-encode the image of sample {i}: {type(exc).__name__}: {exc}") from None

    def sizes(self, i: int) -> list[int]:
        return [len(data) for _, data in self.members(i)]

    def identity(self, i: int) -> dict:
        return self.source.identity(i)  # (how its images are stored is in the description, a setting)


def open_source(src: str, follow_links: bool = False, reencode: Any = None) -> Any:
    """The source ``src`` names: a folder, or ``MODULE:FACTORY``; its images
    stored as ``reencode`` (a conveyor.images.reencode.Reencode) says, when given."""
    if os.path.isdir(src):
        source: Any = FolderSource(src, follow_links)
    elif ":" in src:
        source = DatasetSource(src)
    else:
        raise PackError(f"{src} is neither a folder nor MODULE:FACTORY")
    return source if reencode is None else ReencodedSource(source, reencode)
