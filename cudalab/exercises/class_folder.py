"""A class folder (exercises.submissions): checked before anything in it is read, and its
entries sorted into submissions and refusals without opening a single file.

The folder itself must be a folder of its own: one that is missing, is a file or a
symbolic-link loop, or is the root, a system folder, the folder the run works in (`.`) or
the cudalab repository (or holds either) is refused with a ClassFolderError, before the
workflow plans a job. Its entries are classified by lstat only: a FIFO, socket or device
(whose open could hang or never end), a symbolic link, a bad name, a folder with no or
several .cu files are listed as refused with the reason; nothing can fail the Snakefile's
parse.
"""

from __future__ import annotations

import itertools
import os
import stat
from pathlib import Path

from cudalab import safe_io
from cudalab.exercises.source import valid_name
from cudalab.resources import IMPORT_ROOT

MAX_ENTRIES = 5000  # entries of a class folder (a student each, a README ...)
MAX_STUDENT_ENTRIES = 200  # entries of one student's folder
# Folders that hold the system, never a class: refused themselves and everything below.
SYSTEM_TREES = ("/bin", "/boot", "/dev", "/etc", "/lib", "/lib32", "/lib64", "/libx32",
                "/proc", "/sbin", "/sys", "/usr")
# Folders refused themselves (a class folder below them is fine).
SYSTEM_FOLDERS = ("/", "/home", "/media", "/mnt", "/opt", "/root", "/run", "/srv", "/tmp",
                  "/var")


class ClassFolderError(ValueError):
    """exercises.submissions names no usable class folder; the message says why."""


def _holds(outer: Path, inner: Path) -> bool:
    return inner == outer or outer in inner.parents


def check(folder: Path) -> Path:
    """The class folder, checked: ClassFolderError where it is not a folder of its own."""
    try:
        safe_io.check_folder(folder)
        real = Path(os.path.realpath(folder, strict=True))
    except safe_io.InputRefused as exc:
        raise ClassFolderError(f"the submissions folder {exc}") from None
    except OSError as exc:
        raise ClassFolderError(f"the submissions folder {safe_io.shown(folder)} cannot be "
                               f"resolved: {exc.strerror}") from None
    what = ""
    if str(real) in SYSTEM_FOLDERS or any(_holds(Path(t), real) for t in SYSTEM_TREES):
        what = "a system folder"
    elif _holds(real, Path.cwd().resolve()):
        what = "the folder the run works in, or holds it (results, logs and configs are no " \
               "submissions)"
    elif _holds(real, IMPORT_ROOT.resolve()):
        what = "the cudalab repository, or holds it (the course's own kernels and " \
               "solutions are no submissions)"
    if what:
        raise ClassFolderError(f"the submissions folder {safe_io.shown(folder)} is {real}: "
                               f"{what}; give a folder that holds only the class's "
                               "submissions, one <student>.cu or <student>/<file>.cu each")
    return Path(folder)


def _listing(folder: Path, most: int) -> list[os.DirEntry[str]] | None:
    """The entries of a folder, sorted by name; None where it holds more than `most`."""
    with os.scandir(folder) as it:
        entries = list(itertools.islice(it, most + 1))
    return None if len(entries) > most else sorted(entries, key=lambda e: e.name)


def _mode(entry: os.DirEntry[str]) -> int:
    try:
        return entry.stat(follow_symlinks=False).st_mode
    except OSError:
        return 0


def _in_folder(entry: os.DirEntry[str]) -> tuple[Path | None, str]:
    """(the .cu file, '') of a student's folder, or (None, why it is refused)."""
    try:
        listing = _listing(Path(entry.path), MAX_STUDENT_ENTRIES)
    except OSError as exc:
        return None, f"the folder cannot be read: {exc.strerror}"
    if listing is None:
        return None, f"more than {MAX_STUDENT_ENTRIES} entries in the folder"
    files = [e for e in listing if e.name.endswith(".cu")]
    if len(files) != 1:
        return None, f"{len(files)} .cu files in the folder (one is judged)"
    f, mode = files[0], _mode(files[0])
    if not stat.S_ISREG(mode) or not valid_name(f.name[:-3]):
        return None, (f"{safe_io.shown(f.name)}: a {safe_io.kind(mode)}, not a plain file "
                      "with an allowed name")
    return Path(f.path), ""


def _entry(entry: os.DirEntry[str]) -> tuple[str, Path | None, str]:
    """(student, file, why refused) of one entry of a class folder."""
    mode, name = _mode(entry), entry.name
    student = name[:-3] if name.endswith(".cu") else name
    if stat.S_ISLNK(mode):
        return student, None, "a symbolic link (submissions must be plain files)"
    if stat.S_ISREG(mode):
        if not valid_name(student):
            return student, None, "file name not allowed (letters, digits, _ and - only)"
        return student, Path(entry.path), ""
    if not stat.S_ISDIR(mode):
        return student, None, f"a {safe_io.kind(mode)}, not a submission (never opened)"
    if not valid_name(name):
        return name, None, "folder name not allowed (letters, digits, _ and - only)"
    path, why = _in_folder(entry)
    return name, path, why


def discover(folder: Path) -> tuple[dict[str, Path], list[dict[str, str]]]:
    """{student: file} of the class folder, and the refused entries with the reason."""
    folder = check(Path(folder))
    try:
        listing = _listing(folder, MAX_ENTRIES)
    except OSError as exc:
        raise ClassFolderError(f"the submissions folder {safe_io.shown(folder)} cannot be "
                               f"read: {exc.strerror}") from None
    if listing is None:
        raise ClassFolderError(f"the submissions folder {safe_io.shown(folder)} holds more "
                               f"than {MAX_ENTRIES} entries: not a class folder")
    subs: dict[str, Path] = {}
    rejected: list[dict[str, str]] = []
    for entry in listing:
        regular = stat.S_ISREG(_mode(entry))
        if entry.name.startswith(".") or (regular and not entry.name.endswith(".cu")):
            continue  # hidden files, a README beside the submissions
        student, path, why = _entry(entry)
        if not why and student in subs:
            why = f"a second submission of {student}"
        if why:
            rejected.append({"name": entry.name, "why": why})
        else:
            subs[student] = path
    return subs, rejected
