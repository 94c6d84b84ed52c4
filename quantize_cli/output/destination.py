"""The destination folder: checked first, written in a hidden sibling, renamed when complete.

Work goes to ``<parent>/.<name>.partial/``; only a complete conversion is renamed to DST, so a
failed or interrupted run never leaves a DST that looks finished. A lock (``flock`` on
``<parent>/.<name>.lock``, released by the kernel even on SIGKILL) makes a second run on the same
DST refuse. The lock lives beside the partial folder, not in it, and is held until after the final
rename: a second run can never take it while the finished shards are being published. An existing DST is replaced only with ``--overwrite``, and only after the new one is
complete (the old one is moved aside, the new one renamed in, the old one removed).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil

from ..errors import DestinationError
from ..checkpoint.durable import fsync_path  # a folder too: its entries (the renames) reach the disk

LOCK_NAME = ".quantize.lock"


def _is_within(child: str, parent: str) -> bool:
    return os.path.commonpath([child, parent]) == parent


class Destination:
    """Owns DST for one run: checks, locking, the partial folder and the final rename."""

    def __init__(self, dst: str, src_root: str | None = None, overwrite: bool = False):
        self.dst = os.path.abspath(dst)
        parent, name = os.path.split(self.dst)
        if not name:
            raise DestinationError(f"{dst}: not a valid destination folder name")
        if len(os.fsencode(f".{name}.partial")) > 255:  # the work folder's name must fit the file system's limit
            raise DestinationError(f"{dst[:60]}...: the name is too long for its work folder .NAME.partial (255 bytes at most); choose a shorter -o")
        self.parent = parent
        self.partial = os.path.join(parent, f".{name}.partial")
        self.lock_path = os.path.join(parent, f".{name}.lock")
        self.overwrite = overwrite
        self._lock_fd: int | None = None
        self._keep = False  # keep the partial folder on discard (commit found a new DST in the way)
        self.acquired = False  # this run took the lock (the work folder is its own)
        if src_root is not None:
            self._check_overlap(os.path.realpath(src_root))
        if os.path.lexists(self.dst) and not overwrite:
            raise DestinationError(f"{dst}: already exists; choose another -o or pass --overwrite to replace it")
        if os.path.lexists(self.dst) and not os.path.isdir(self.dst):
            raise DestinationError(f"{dst}: exists and is not a folder; remove it or choose another -o")
        if not os.path.isdir(parent):  # nothing is ever created outside DST (a typo in -o must not build a tree)
            raise DestinationError(f"{dst}: its folder {parent} does not exist; create it first or choose another -o")

    def _check_overlap(self, src: str) -> None:
        dst = os.path.realpath(self.dst)
        if dst == src:
            raise DestinationError(f"{self.dst}: is the source checkpoint itself; write the output to another folder")
        if _is_within(dst, src):
            raise DestinationError(f"{self.dst}: is inside the source checkpoint {src}; write the output elsewhere")
        if _is_within(src, dst):
            raise DestinationError(f"{self.dst}: contains the source checkpoint {src}; write the output elsewhere")
        partial = os.path.realpath(self.partial)
        if _is_within(partial, src) or _is_within(src, partial):
            raise DestinationError(f"{self.dst}: its work folder {self.partial} overlaps the source {src}; write the output elsewhere")

    def _lock(self) -> None:
        """Take the flock on the lock file beside the partial folder (or refuse: another run holds it).

        The holder unlinks the file when it is done; a run that locked a file which was unlinked
        meanwhile (its inode is no longer at the path) retries on the new file.
        """
        for _ in range(100):
            try:
                fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
            except OSError as exc:
                raise DestinationError(f"{self.lock_path}: cannot create the lock file ({exc.strerror}); check that {self.parent} is writable") from exc
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise DestinationError(
                    f"{self.dst}: another quantize run is writing it (lock {self.lock_path}); wait for it or choose another -o"
                ) from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.lock_path, follow_symlinks=False).st_ino
            except FileNotFoundError:
                same = False
            if same:
                self._lock_fd, self.acquired = fd, True
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                return
            os.close(fd)
        raise DestinationError(f"{self.lock_path}: the lock file keeps changing; another process is racing for {self.dst}; rerun")

    def acquire(self, resume: bool = False) -> bool:
        """Lock DST, create the partial folder. Returns True if it held earlier work (to resume)."""
        if os.path.islink(self.partial) or (os.path.lexists(self.partial) and not os.path.isdir(self.partial)):
            raise DestinationError(f"{self.partial}: exists and is not a work folder (a link or a file); remove it and rerun")
        self._lock()  # from here on this run owns the work folder (discard may remove it)
        try:
            os.makedirs(self.partial, exist_ok=True)
            earlier = [e for e in os.listdir(self.partial) if e != LOCK_NAME]  # LOCK_NAME: left by older versions
            if earlier and not resume:
                for entry in earlier:
                    path = os.path.join(self.partial, entry)
                    shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
        except OSError as exc:
            self.release()
            raise DestinationError(f"{self.partial}: cannot prepare the work folder ({exc.strerror}); check permissions and space") from exc
        return bool(earlier) and resume

    def path(self, *parts: str) -> str:
        return os.path.join(self.partial, *parts)

    def commit(self) -> None:
        """Atomically publish the partial folder as DST (replacing an old DST if allowed).

        The renames run with SIGINT/SIGTERM held back (:func:`quantize_cli.signals.deferred`), so
        an interruption lands before or after them, never between: DST is the old folder or the
        complete new one. An OSError leaves the old DST in place.
        """
        from ..signals import deferred

        with deferred():
            old = None
            if os.path.lexists(self.dst) and not self.overwrite:  # appeared while we worked
                self._keep = True
                raise DestinationError(f"{self.dst}: appeared during the run; the new output is kept in {self.partial}; move it yourself")
            try:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(self.partial, LOCK_NAME))
                fsync_path(self.partial)
                if os.path.lexists(self.dst):
                    old = os.path.join(self.parent, f".{os.path.basename(self.dst)}.old-{os.getpid()}")
                    os.rename(self.dst, old)
                try:
                    os.rename(self.partial, self.dst)
                except OSError:
                    if old:
                        os.rename(old, self.dst)
                        old = None
                    raise
            except OSError as exc:
                raise DestinationError(f"{self.dst}: cannot publish the finished output ({exc.strerror}); check permissions and space") from exc
            with contextlib.suppress(OSError):  # DST is complete and in place; durability of the rename is best effort
                fsync_path(self.parent)
            self.release()
        if old:  # the replaced DST: a folder, or a link to one (only the link goes; its target is not ours)
            if os.path.islink(old):
                with contextlib.suppress(OSError):
                    os.unlink(old)
            else:
                shutil.rmtree(old, ignore_errors=True)

    def set_aside(self, tag: str) -> str:
        """Move the (complete but refused) work folder to ``DST.<tag>`` beside DST for inspection.

        Never over an existing path: ``DST.<tag>-2``, ``-3`` ... Returns where it went (the work
        folder itself if it could not be moved).
        """
        for n in range(1, 1000):
            target = f"{self.dst}.{tag}" + (f"-{n}" if n > 1 else "")
            if os.path.lexists(target):
                continue
            try:
                os.rename(self.partial, target)
            except OSError:
                break
            return target
        self._keep = True
        return self.partial

    def discard(self) -> None:
        """Remove the partial folder (used for failures that resume cannot help).

        Only a run that holds the lock removes it: a run refused because another one is writing
        DST must not delete that run's work.
        """
        owned = self._lock_fd is not None
        self.release()
        if owned and not self._keep:
            shutil.rmtree(self.partial, ignore_errors=True)

    def release(self) -> None:
        """Drop the lock: unlink the lock file while still holding it, then close it."""
        if self._lock_fd is not None:
            with contextlib.suppress(OSError):
                if os.fstat(self._lock_fd).st_ino == os.stat(self.lock_path, follow_symlinks=False).st_ino:
                    os.unlink(self.lock_path)
            os.close(self._lock_fd)
            self._lock_fd = None

