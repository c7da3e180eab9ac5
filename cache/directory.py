"""The cache directory, resolved and opened once, checked through its descriptor.

Whoever can write the cache directory can make jitop load native code of their choosing, so the directory
must be the user's own and closed to group and others. Checking a path and then using the path again leaves a
window (a symlink flipped between the check and the use, 9 runs in 150 in a probe): here the path is resolved
once, the directory is opened (`O_DIRECTORY | O_NOFOLLOW`), its owner and mode are checked on the descriptor
(`fstat`), and everything inside is reached through that descriptor (`/proc/self/fd/N` for SQLite and
diskcache, `dir_fd` for jitop's own reads): what was checked is what is read.

>>> import tempfile
>>> d = CacheDirectory(tempfile.mkdtemp())
>>> os.path.isfile(os.path.join(d.open(), "anything"))
False
>>> d.close()
"""
from __future__ import annotations

import errno
import os
import stat

_FLAGS = os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
_BY_DESCRIPTOR = os.path.isdir("/proc/self/fd")  # Linux: a path through the descriptor, not the name


class Refused(PermissionError):
    """The directory must not be used as a cache; the message says why (it completes "the directory ...")."""


def refusal(st: os.stat_result) -> str | None:
    """Why a directory with this status must not be a cache (not a directory, not the user's own, writable by
    group or others), or None."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if hasattr(os, "geteuid") and st.st_uid != os.geteuid():
        return f"is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    writers = [who for who, bit in (("its group", stat.S_IWGRP), ("others", stat.S_IWOTH)) if st.st_mode & bit]
    if writers:
        return f"is writable by {' and '.join(writers)} (mode {stat.S_IMODE(st.st_mode):o})"
    return None


class CacheDirectory:
    """One cache directory of this process: `open()` once, then `path` and `fd` reach what was checked."""

    def __init__(self, given: str):
        self.given = given
        self.fd: int | None = None
        self.path: str | None = None

    def open(self) -> str:
        """The path to use for everything inside (through the descriptor where the OS allows), opening and
        checking the directory on first use (creating it, mode 700, if it does not exist). Raises Refused."""
        if self.path is None:
            fd = _open_checked(self.given)
            self.fd, self.path = fd, f"/proc/self/fd/{fd}" if _BY_DESCRIPTOR else _resolved(self.given)
        return self.path

    def close(self) -> None:
        """Close the descriptor (the next `open()` resolves and checks the directory again)."""
        fd, self.fd, self.path = self.fd, None, None
        if fd is not None:
            try:
                os.close(fd)
            except OSError:
                pass


def _resolved(given: str) -> str:
    return os.path.realpath(os.path.abspath(os.path.expanduser(given)))


def _open_checked(given: str) -> int:
    """A descriptor of the directory `given` names, checked; its mode narrowed to 700 where group or others
    could read it (what diskcache creates inside follows the umask)."""
    path = os.path.abspath(os.path.expanduser(given))
    if os.path.islink(path) and not os.path.exists(path):
        raise Refused(f"is a symbolic link to {os.readlink(path)!r}, which does not exist "
                      "(create that directory, or point JITOP_CACHE_DIR elsewhere)")
    resolved = os.path.realpath(path)
    try:
        fd = _open_directory(resolved)
    except FileNotFoundError:
        try:
            os.makedirs(resolved, mode=0o700, exist_ok=True)
        except FileExistsError:
            raise Refused("is not a directory") from None
        except OSError as err:
            raise Refused(f"cannot be created ({err.strerror})") from None
        fd = _open_directory(resolved)
    try:
        st = os.fstat(fd)
        why = refusal(st)
        if why is not None:
            raise Refused(why)
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o700)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _open_directory(resolved: str) -> int:
    try:
        return os.open(resolved, _FLAGS)
    except FileNotFoundError:
        raise
    except NotADirectoryError:
        raise Refused("is not a directory") from None
    except OSError as err:
        if err.errno == errno.ELOOP:  # resolved a moment ago, a symlink now
            raise Refused("was replaced by a symbolic link while it was being opened") from None
        raise Refused(f"cannot be opened ({err.strerror})") from None
