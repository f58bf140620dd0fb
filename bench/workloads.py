"""Datasets of the benchmarks, importable by child scripts (spawn workers
find them by module name)."""

import numpy as np


class FreshImages:
    """64-byte-aligned uint8 images of 3x224x224, made anew for every sample."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full((3, 224, 224), i % 251, dtype=np.uint8)


class Ints:
    """Sample i is the int i."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


class TorchAugmented:
    """ImageNet-style augmentation done with torch ops: a synthetic uint8
    HxWx3 image made for each sample, random resized crop (30-100% of the
    area, aspect 3/4 to 4/3, ``F.interpolate`` to 224x224), horizontal flip,
    to float, normalize. Sample: (3x224x224 float32 tensor, int label).

    torch is imported on first use, so this module stays numpy-only for the
    workloads that do not need it (a spawn worker unpickling ``Ints`` must
    not pay for importing torch)."""

    def __init__(self, n: int, height: int = 256, width: int = 320, size: int = 224):
        self.n, self.height, self.width, self.size = n, height, width, size

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch
        import torch.nn.functional as F

        image = torch.randint(0, 256, (self.height, self.width, 3), dtype=torch.uint8)
        image = image.permute(2, 0, 1).float().div_(255)
        area = self.height * self.width * torch.empty(()).uniform_(0.3, 1.0).item()
        ratio = torch.empty(()).uniform_(-0.2877, 0.2877).exp().item()  # log(3/4) .. log(4/3)
        h = max(1, min(self.height, round((area / ratio) ** 0.5)))
        w = max(1, min(self.width, round((area * ratio) ** 0.5)))
        top = int(torch.randint(0, self.height - h + 1, ()))
        left = int(torch.randint(0, self.width - w + 1, ()))
        crop = image[None, :, top : top + h, left : left + w]
        image = F.interpolate(crop, size=(self.size, self.size), mode="bilinear", align_corners=False)[0]
        if torch.rand(()) < 0.5:
            image = image.flip(-1)
        mean = torch.tensor([0.485, 0.456, 0.406]).view(3, 1, 1)
        std = torch.tensor([0.229, 0.224, 0.225]).view(3, 1, 1)
        return (image - mean) / std, i % 1000


class Waits:
    """Map-style: sample ``i`` is a small array, after waiting ``seconds``
    (as a read from a remote store would: time, but no CPU)."""

    def __init__(self, n: int, seconds: float = 0.02):
        self.n, self.seconds = n, seconds

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        import time

        time.sleep(self.seconds)
        return np.full(16, i, dtype=np.int64)


class Huge:
    """Sample ``i``: ``nbytes`` of uint8, made anew (a whole volume, a long
    video), one per batch."""

    def __init__(self, n: int, nbytes: int = 2 << 30):
        self.n, self.nbytes = n, nbytes

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(self.nbytes, i % 251, dtype=np.uint8)
