"""The Store's cache folder: private to the user who runs conveyor, or refused.

A cache folder that another user may write could hold files that would be
handed out as objects, so a folder that is not yours, that others may
write, or that is a symbolic link another user made is refused
(PermissionError, saying what to do); one that others may only read is
made 0700.
"""

from __future__ import annotations

import os
import stat
import tempfile


def default_cache_dir() -> str:
    """A cache folder of this user's own in the temporary folder (its name carries the uid)."""
    return os.path.join(tempfile.gettempdir(), f"conveyor-store-cache-{os.getuid()}")


def make_private(folder: str) -> None:
    """Create ``folder`` (0700), or make sure the one there is private to
    this user: it must be a folder of yours that nobody else may write
    (PermissionError otherwise, saying what to do); one that others may
    only read is made 0700."""
    os.makedirs(os.path.dirname(os.path.abspath(folder)), exist_ok=True)
    try:
        os.mkdir(folder, 0o700)
    except FileExistsError:
        pass
    me, link = os.getuid(), os.lstat(folder)
    if stat.S_ISLNK(link.st_mode) and link.st_uid not in (me, 0):
        _refuse(folder, f"is a symbolic link made by uid {link.st_uid}")
    info = os.stat(folder)
    if not stat.S_ISDIR(info.st_mode):
        raise NotADirectoryError(
            f"conveyor: the Store's cache folder {folder} is not a folder; give Store(cache_dir=...) a folder"
        )
    if info.st_uid != me:
        _refuse(folder, f"belongs to uid {info.st_uid}, not to you (uid {me})")
    if info.st_mode & 0o022:
        _refuse(folder, f"may be written by others (mode {stat.S_IMODE(info.st_mode):o}); `chmod 700 {folder}`, or")
    if info.st_mode & 0o077:
        os.chmod(folder, 0o700)  # (yours, and readable by others: made private)


def _refuse(folder: str, why: str) -> None:
    raise PermissionError(
        f"conveyor: the Store's cache folder {folder} {why}: another user could put files there that would be "
        f"handed out as objects. Give Store(cache_dir=...) a folder of your own."
    )
