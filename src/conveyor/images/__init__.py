"""Images decoded straight into the batch: decode + RandomResizedCrop + flip
in one step, choosing the crop box before decoding and decoding no more
than the box needs (``pip install 'conveyor[images]'``; see docs/images.md).

    dataset[i] ──▶ RandomResizedCrop(224)(jpeg bytes): header read, box and flip
                   drawn (torchvision's distribution, conveyor.sample_rng())
               ──▶ PendingImage (still encoded)
    worker     ──▶ its row of the batch in shared memory: only the box's region
                   decoded (TurboJPEG: DCT scaling, region decode), resized
                   (OpenCV), flipped, written in place

Modules, one concept each::

    boxes.py       torchvision's RandomResizedCrop box distribution
    geometry.py    box -> DCT scale, region to decode, box inside the region
    turbojpeg.py   a ctypes binding to TurboJPEG 3 (header, scaled region decode)
    resample.py    resize, flip, layout and dtype of the output
    decode.py      one box decoded: TurboJPEG, or Pillow for other files
    transforms.py  RandomResizedCrop and the PendingImage it returns
    folder.py      ImageFolder (root/<class>/<image>)
    reencode.py    images re-encoded at a maximum side (conveyor pack --max-side)
    advice.py      what conveyor doctor --data says about JPEG files
"""

from .boxes import Box, random_resized_crop_box
from .folder import IMAGE_EXTENSIONS, ImageFolder
from .transforms import PendingImage, RandomResizedCrop


def decoders() -> dict[str, str]:
    """Which libraries this process decodes and resizes with: ``{"jpeg":
    "turbojpeg" or "pillow", "resize": "opencv" or "pillow"}``."""
    from .resample import opencv
    from .turbojpeg import library

    return {"jpeg": "turbojpeg" if library() is not None else "pillow", "resize": "opencv" if opencv() else "pillow"}


__all__ = [
    "RandomResizedCrop",
    "PendingImage",
    "ImageFolder",
    "Box",
    "random_resized_crop_box",
    "decoders",
    "IMAGE_EXTENSIONS",
]
