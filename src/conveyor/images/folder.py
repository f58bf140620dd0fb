"""ImageFolder: torchvision's folder layout (``root/<class>/<image>``), with
samples kept encoded until a transform such as RandomResizedCrop turns them
into pixels."""

from __future__ import annotations

import os
from typing import Any, Callable, Optional

from ..dataset import CompactList

#: File endings taken as images (torchvision's IMG_EXTENSIONS, lower case).
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class ImageFolder:
    """A map-style dataset over ``root/<class>/<image>``: sample ``i`` is
    ``(transform(encoded bytes), class index)``, classes numbered in sorted
    order as torchvision's ImageFolder does. Example::

        from conveyor.images import ImageFolder, RandomResizedCrop
        dataset = ImageFolder("train/", RandomResizedCrop(224))

    ``transform=None`` gives the file's bytes. Paths are kept in a
    :class:`~conveyor.CompactList`, so forked workers do not copy them.
    """

    def __init__(
        self,
        root: str,
        transform: Optional[Callable[[bytes], Any]] = None,
        extensions: tuple[str, ...] = IMAGE_EXTENSIONS,
    ):
        self.root = str(root)
        self.classes = sorted(entry.name for entry in os.scandir(self.root) if entry.is_dir())
        if not self.classes:
            raise ValueError(f"{self.root} has no class folders; expected {self.root}/<class>/<image>")
        self.class_to_idx = {name: i for i, name in enumerate(self.classes)}
        paths, labels = [], []
        for label, name in enumerate(self.classes):
            folder = os.path.join(self.root, name)
            for file in sorted(os.listdir(folder)):
                if file.lower().endswith(extensions):
                    paths.append(os.path.join(folder, file))
                    labels.append(label)
        if not paths:
            raise ValueError(f"no images ({', '.join(extensions)}) under {self.root}/<class>/")
        self.paths = CompactList(paths)
        self.targets = labels
        self.transform = transform

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        with open(self.paths[index], "rb") as f:
            data = f.read()
        return (data if self.transform is None else self.transform(data)), self.targets[index]
