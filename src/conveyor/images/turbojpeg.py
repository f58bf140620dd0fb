"""A small ctypes binding to libjpeg-turbo's TurboJPEG 3 API: read a JPEG's
header, then decode only a region of it at a reduced scale, into a buffer
the caller owns.

    tj3DecompressHeader ──▶ width, height, chroma subsampling (a few µs)
    tj3SetScalingFactor ──▶ DCT scaling: 1/2, 1/4, 1/8 cost less than a full decode
    tj3SetCroppingRegion ─▶ rows above the region are entropy-decoded only, rows below
                            are never read, columns outside are not transformed
    tj3Decompress8 ───────▶ RGB rows written straight into the caller's array

Where the library comes from (the first that exports ``tj3Init``): the file
named by ``CONVEYOR_TURBOJPEG``; the copy bundled in the ``turbojpeg`` wheel
(``pip install conveyor[images]``); the system's ``libturbojpeg`` (version 3
or later: Debian 12's 2.1 has no TurboJPEG 3 API). :func:`library` is None
when there is none; conveyor.images then decodes with Pillow.

A TurboJPEG handle is not thread-safe: each thread gets its own
(:func:`handle`), freed when the thread ends. ctypes releases the GIL
around every call, so reading threads decode in parallel.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from fractions import Fraction
from typing import Any, NamedTuple, Optional

import numpy as np

# TurboJPEG 3 constants (turbojpeg.h; the same from 3.0 to 3.1).
_TJINIT_DECOMPRESS = 1
_TJPARAM_STOPONWARNING = 0
_TJPARAM_SUBSAMP = 4
_TJPARAM_JPEGWIDTH = 5
_TJPARAM_JPEGHEIGHT = 6
_TJPARAM_COLORSPACE = 8
_TJPARAM_FASTUPSAMPLE = 9
_TJPARAM_FASTDCT = 10
_TJPF_RGB = 0
_TJERR_WARNING = 0
#: iMCU width in pixels by TJSAMP (444, 422, 420, GRAY, 440, 411, 441): a region's left edge is a multiple of it.
_MCU_WIDTH = {0: 8, 1: 16, 2: 16, 3: 8, 4: 8, 5: 32, 6: 8}
#: TJCS_CMYK and TJCS_YCCK: no RGB output from TurboJPEG (Pillow converts them).
_CMYK_COLORSPACES = (3, 4)


class _Region(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int), ("h", ctypes.c_int)]


class _Scaling(ctypes.Structure):
    _fields_ = [("num", ctypes.c_int), ("denom", ctypes.c_int)]


class JpegHeader(NamedTuple):
    """What a JPEG's header says: its size in pixels, and the width of its
    iMCU (a decoded region's left edge is a multiple of it, scaled)."""

    width: int
    height: int
    mcu_width: int


class TurboJpegError(ValueError):
    """TurboJPEG could not decode the data (not a JPEG, CMYK, damaged beyond recovery)."""


def _candidates() -> list[str]:
    """Library files to try, in order."""
    named = os.environ.get("CONVEYOR_TURBOJPEG")
    found = [named] if named else []
    try:
        from importlib.metadata import PackageNotFoundError, files

        try:
            for entry in files("turbojpeg") or ():
                name = os.path.basename(str(entry))
                if name.startswith("libturbojpeg") and (".so" in name or name.endswith((".dylib", ".dll"))):
                    found.append(str(entry.locate()))
        except PackageNotFoundError:
            pass
    except ImportError:  # (Python without importlib.metadata)
        pass
    system = ctypes.util.find_library("turbojpeg")
    if system:
        found.append(system)
    return found


def _load(path: str) -> Optional[ctypes.CDLL]:
    try:
        lib = ctypes.CDLL(path)
        lib.tj3Init  # noqa: B018  (TurboJPEG 2 has no tj3 functions)
    except (OSError, AttributeError):
        return None
    vp, i = ctypes.c_void_p, ctypes.c_int
    lib.tj3Init.argtypes, lib.tj3Init.restype = [i], vp
    lib.tj3Destroy.argtypes, lib.tj3Destroy.restype = [vp], None
    lib.tj3Set.argtypes = [vp, i, i]
    lib.tj3Get.argtypes = [vp, i]
    lib.tj3GetErrorStr.argtypes, lib.tj3GetErrorStr.restype = [vp], ctypes.c_char_p
    lib.tj3GetErrorCode.argtypes = [vp]
    lib.tj3DecompressHeader.argtypes = [vp, vp, ctypes.c_size_t]
    lib.tj3SetScalingFactor.argtypes = [vp, _Scaling]
    lib.tj3SetCroppingRegion.argtypes = [vp, _Region]
    lib.tj3Decompress8.argtypes = [vp, vp, ctypes.c_size_t, vp, i, i]
    return lib


_LIBRARY: Any = False  # False: not looked for yet; None: none found
_lock = threading.Lock()


def library() -> Optional[ctypes.CDLL]:
    """The TurboJPEG 3 library (loaded once per process), or None."""
    global _LIBRARY
    if _LIBRARY is False:
        with _lock:
            if _LIBRARY is False:
                _LIBRARY = next((lib for lib in map(_load, _candidates()) if lib is not None), None)
    library: Optional[ctypes.CDLL] = _LIBRARY
    return library


class _Handle:
    """One thread's decompressor; destroyed with the thread's locals."""

    def __init__(self, lib: ctypes.CDLL):
        self.lib = lib
        self.pointer = lib.tj3Init(_TJINIT_DECOMPRESS)
        if not self.pointer:
            raise MemoryError("tj3Init failed")
        lib.tj3Set(self.pointer, _TJPARAM_STOPONWARNING, 0)  # (as libjpeg: a recoverable error is a warning)

    def __del__(self) -> None:
        if getattr(self, "pointer", None):
            self.lib.tj3Destroy(self.pointer)
            self.pointer = None


_local = threading.local()


def handle() -> _Handle:
    """This thread's decompressor (TurboJPEG handles are not thread-safe)."""
    h = getattr(_local, "handle", None)
    if h is None:
        lib = library()
        if lib is None:
            raise TurboJpegError("no TurboJPEG 3 library: pip install 'conveyor[images]'")
        h = _local.handle = _Handle(lib)
    return h


def _address(data: Any) -> tuple[Any, int]:
    """(something ctypes passes as the data's address, its length in bytes), without a copy."""
    if isinstance(data, bytes):
        return data, len(data)
    array = np.frombuffer(data, np.uint8)
    return array.ctypes.data, array.size


def _fail(h: _Handle, doing: str) -> None:
    """Raise for the last call's error, unless it was only a warning (corrupt data decoded as well as it could be)."""
    lib = h.lib
    if lib.tj3GetErrorCode(h.pointer) == _TJERR_WARNING:
        return
    message = (lib.tj3GetErrorStr(h.pointer) or b"").decode("utf-8", "replace")
    raise TurboJpegError(f"TurboJPEG could not {doing}: {message}")


def read_header(data: Any) -> JpegHeader:
    """The JPEG's size and iMCU width; TurboJpegError for data TurboJPEG cannot decode to RGB."""
    h = handle()
    address, size = _address(data)
    if h.lib.tj3DecompressHeader(h.pointer, address, size) != 0:
        _fail(h, "read the JPEG header")
    lib, p = h.lib, h.pointer
    if lib.tj3Get(p, _TJPARAM_COLORSPACE) in _CMYK_COLORSPACES:
        raise TurboJpegError("TurboJPEG decodes no CMYK JPEG to RGB")
    subsampling = lib.tj3Get(p, _TJPARAM_SUBSAMP)
    return JpegHeader(
        lib.tj3Get(p, _TJPARAM_JPEGWIDTH), lib.tj3Get(p, _TJPARAM_JPEGHEIGHT), _MCU_WIDTH.get(subsampling, 32)
    )


def decode_region(
    data: Any, scale: Fraction, region: tuple[int, int, int, int], out: np.ndarray, fast: bool = False
) -> None:
    """Decode ``region`` (x, y, width, height, in pixels of the image scaled
    by ``scale``; x a multiple of the scaled iMCU width) of the JPEG into
    ``out``, a uint8 array of shape (height, width, 3) whose rows may be
    strided. ``fast``: TurboJPEG's fast IDCT and chroma upsampling."""
    h = handle()
    lib, p = h.lib, h.pointer
    address, size = _address(data)
    if lib.tj3DecompressHeader(p, address, size) != 0:
        _fail(h, "read the JPEG header")
    lib.tj3Set(p, _TJPARAM_FASTDCT, int(fast))
    lib.tj3Set(p, _TJPARAM_FASTUPSAMPLE, int(fast))
    if lib.tj3SetScalingFactor(p, _Scaling(scale.numerator, scale.denominator)) != 0:
        _fail(h, f"scale by {scale}")
    x, y, w, hh = region
    if out.shape != (hh, w, 3) or out.dtype != np.uint8 or out.strides[1:] != (3, 1):
        raise ValueError(
            f"decode_region: out must be uint8 ({hh}, {w}, 3) with packed pixels, got {out.dtype} {out.shape}"
        )
    if lib.tj3SetCroppingRegion(p, _Region(x, y, w, hh)) != 0:
        _fail(h, f"crop to {region} at scale {scale}")
    if lib.tj3Decompress8(p, address, size, out.ctypes.data, out.strides[0], _TJPF_RGB) != 0:
        _fail(h, "decode the JPEG")
