"""Deleting an expired entry without losing a write vLLM makes meanwhile: rename, check the mtime
on the renamed inode, put back what a writer touched (the package docstring says why)."""

from __future__ import annotations

import errno
import os
import secrets

from .entries import Entry, gone

TRASH_MARK = ".janitor-deleting."


class _WrittenMeanwhile(Exception):
    """A file of the entry became younger than the cutoff: the entry is live again."""


def _original_name(name: str) -> str:
    return name.split(TRASH_MARK, 1)[0]


def _put_back(trash: str, original: str) -> None:
    try:
        os.link(trash, original)
    except FileExistsError:
        return  # a newer file took the name; ours stays as trash and ages out later
    except OSError as exc:
        if gone(exc):
            return  # another janitor moved it on and will judge it itself
        # Filesystems without hard links: rename back unless something new took the name.
        if not os.path.lexists(original):
            os.rename(trash, original)
        return
    os.unlink(trash)


def _remove_file(path: str, cutoff: float) -> int:
    """Delete one file unless it was written after `cutoff`; the bytes freed (0 if already gone)."""
    try:
        if os.lstat(path).st_mtime > cutoff:
            raise _WrittenMeanwhile(path)
        directory, name = os.path.split(path)
        original = os.path.join(directory, _original_name(name))
        trash = f"{original}{TRASH_MARK}{secrets.token_hex(6)}"
        os.rename(path, trash)
        st = os.lstat(trash)
        if st.st_mtime > cutoff:  # a writer truncated it between our check and the rename
            _put_back(trash, original)
            raise _WrittenMeanwhile(path)
        os.unlink(trash)
        return st.st_size
    except OSError as exc:
        if gone(exc):
            return 0
        raise


def _remove_empty_dir(directory: str) -> None:
    try:
        os.rmdir(directory)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):  # POSIX allows either for a non-empty directory
            raise _WrittenMeanwhile(directory) from None  # a writer arrived after we listed it
        if not gone(exc):
            raise


def _remove_contents(directory: str, cutoff: float) -> tuple[int, bool]:
    """Delete what `directory` holds, keeping the directory: (bytes freed, whether all of it went)."""
    freed, everything = 0, True
    try:
        children = list(os.scandir(directory))
    except OSError as exc:
        if gone(exc):
            return 0, True
        raise
    for child in children:
        try:
            if child.is_dir(follow_symlinks=False):  # vLLM makes none; whatever made it, it is old
                sub_freed, sub_everything = _remove_contents(child.path, cutoff)
                freed += sub_freed
                if not sub_everything:
                    raise _WrittenMeanwhile(child.path)
                _remove_empty_dir(child.path)
            else:
                freed += _remove_file(child.path, cutoff)
        except _WrittenMeanwhile:
            everything = False
    return freed, everything


def delete_entry(entry: Entry, cutoff: float) -> tuple[bool, int]:
    """Delete an expired entry unless something in it was written after `cutoff`: (deleted, bytes freed).

    An entry with files loses its files and keeps its directory; removing them makes the directory
    young, so a later sweep removes it once it has been empty for a TTL. Only a directory that was
    empty when scanned is removed. This leaves the directory in place for a vLLM writer that has just
    run `os.makedirs(..., exist_ok=True)` for it and is about to create the file."""
    path = str(entry.path)
    if entry.empty:
        try:
            _remove_empty_dir(path)
        except _WrittenMeanwhile:
            return False, 0
        return True, 0
    freed, everything = _remove_contents(path, cutoff)
    return everything, freed
