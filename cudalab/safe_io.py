"""Opening paths that come from outside cudalab: a baseline folder's records, a student's
file, a class folder, a path a config names. Every such path is checked before it is
opened, and every read is bounded:

* the name: no NUL, each component at most NAME_MAX bytes, the whole at most PATH_MAX (a
  300-character component is a clear error, not an OSError from deep inside);
* the type, from lstat/stat and again from fstat of the open descriptor: a regular file or a
  folder, never a FIFO (its open would wait for a writer for ever), a socket or a device
  (/dev/zero never ends). Files are opened with O_NONBLOCK, so not even a FIFO planted
  between the check and the open can hang it;
* the size, from fstat before reading, and the read itself stops one byte past the limit (a
  file that grows while it is read is caught too);
* folders: walked without following symbolic links (a `raw -> /` link is named and not
  entered, so no loop can form), at most `max_depth` levels and `max_files` files; a root
  that resolves outside the folder it must stay in is refused;
* JSON: at most `max_depth` levels of nesting, counted by a loop over the text before the
  parser sees it (a 1100-deep document never reaches the recursive parser).

Every refusal is an InputRefused whose message names the path (control characters escaped)
and what is allowed.
"""

from __future__ import annotations

import errno
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudalab.safe_text import printable

NAME_MAX = 255  # bytes of one path component (Linux and its file systems)
PATH_MAX = 4095  # bytes of a whole path
MAX_JSON_BYTES = 64 * 1024 * 1024
MAX_JSON_DEPTH = 64  # cudalab's records nest 4 levels; Python's parser recurses per level
_CHUNK = 1 << 20


class InputRefused(ValueError):
    """A path or its content refused before (or while) it is read; the message says why."""


def shown(path: str | os.PathLike[str]) -> str:
    """A path as a message shows it: control characters escaped, a huge name shortened."""
    text = printable(os.fsdecode(path))
    return text if len(text) <= 160 else f"{text[:100]}...{text[-40:]} ({len(text)} chars)"


def check_name(path: str | os.PathLike[str]) -> None:
    """Refuse a path the kernel would refuse with ENAMETOOLONG, or one holding NUL."""
    raw = os.fsencode(path)
    if b"\0" in raw:
        raise InputRefused(f"{shown(path)}: the path holds a NUL byte")
    if len(raw) > PATH_MAX:
        raise InputRefused(f"{shown(path)}: the path has {len(raw)} bytes; at most {PATH_MAX}")
    for part in raw.split(b"/"):
        if len(part) > NAME_MAX:
            raise InputRefused(f"{shown(path)}: the name {shown(os.fsdecode(part))} has "
                               f"{len(part)} bytes; a file or folder name may have at most "
                               f"{NAME_MAX}")


def kind(mode: int) -> str:
    """What a stat mode is, in words."""
    for test, name in ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "folder"),
                       (stat.S_ISLNK, "symbolic link"), (stat.S_ISFIFO, "FIFO (named pipe)"),
                       (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"),
                       (stat.S_ISBLK, "block device")):
        if test(mode):
            return name
    return "special file"


def _refusal(path: str | os.PathLike[str], exc: OSError, nofollow: bool = False
             ) -> InputRefused:
    why = {errno.ENOENT: "does not exist", errno.ENOTDIR: "has a part that is not a folder",
           errno.ELOOP: ("is a symbolic link (not followed)" if nofollow
                         else "is a symbolic link loop (or a chain of too many links)"),
           errno.ENAMETOOLONG: "has a name too long for the file system",
           errno.EACCES: "cannot be read: permission denied",
           errno.EPERM: "cannot be read: permission denied",
           errno.ENXIO: "is a socket or a device without a reader, not a regular file",
           errno.EISDIR: "is a folder, not a file"}.get(exc.errno)
    return InputRefused(f"{shown(path)} {why}" if why else
                        f"{shown(path)} cannot be read: {exc.strerror or exc}")


def _why(path: str | os.PathLike[str], exc: OSError) -> str:
    """An OSError of `path` in words, without the path (a walk lists the path beside it)."""
    return str(_refusal(path, exc)).removeprefix(shown(path)).strip(" :")


def lstat(path: str | os.PathLike[str], follow_symlinks: bool = True) -> os.stat_result:
    """stat (or lstat) of a checked name; every OSError an InputRefused naming the path."""
    check_name(path)
    try:
        return os.stat(path, follow_symlinks=follow_symlinks)
    except OSError as exc:
        raise _refusal(path, exc) from None


def special_problem(path: str | os.PathLike[str]) -> str:
    """Why `path` must not be opened: a name too long, a FIFO, socket or device, a link
    loop ('' for a regular file, a folder, or a path that does not exist: the caller's own
    open says so in its words)."""
    try:
        check_name(path)
        st = os.stat(path)
    except InputRefused as exc:
        return str(exc)
    except FileNotFoundError:
        return ""
    except OSError as exc:
        return str(_refusal(path, exc))
    if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
        return ""
    return f"{shown(path)} is a {kind(st.st_mode)}, not a regular file (not opened)"


def check_folder(path: str | os.PathLike[str]) -> Path:
    """The path of an existing folder (links followed, a loop refused), else InputRefused."""
    st = lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise InputRefused(f"{shown(path)} is a {kind(st.st_mode)}, not a folder")
    return Path(path)


def resolved_inside(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> Path:
    """The real path of `path`, refused where it is not `root` or below it (a link out of
    the folder it belongs to) or cannot be resolved (a loop)."""
    check_name(path)
    try:
        real = Path(os.path.realpath(path, strict=True))
        top = Path(os.path.realpath(root, strict=True))
    except OSError as exc:
        raise _refusal(path, exc) from None
    if real != top and top not in real.parents:
        raise InputRefused(f"{shown(path)} leads to {shown(real)}, outside {shown(top)}: a "
                           "symbolic link out of the folder is not followed")
    return real


def read_bytes(path: str | os.PathLike[str], max_bytes: int,
               follow_symlinks: bool = True) -> bytes:
    """The content of a regular file of at most max_bytes; anything else is InputRefused
    before a byte is read (a FIFO, socket or device; a file too large)."""
    st = lstat(path, follow_symlinks)
    if not stat.S_ISREG(st.st_mode):
        raise InputRefused(f"{shown(path)} is a {kind(st.st_mode)}, not a regular file")
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    flags |= 0 if follow_symlinks else os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as exc:
        raise _refusal(path, exc, nofollow=not follow_symlinks) from None
    try:
        st = os.fstat(fd)  # the file opened, not the one checked: it may have been swapped
        if not stat.S_ISREG(st.st_mode):
            raise InputRefused(f"{shown(path)} is a {kind(st.st_mode)}, not a regular file")
        if st.st_size > max_bytes:
            raise InputRefused(f"{shown(path)} has {st.st_size} bytes; at most {max_bytes} "
                               "are read")
        chunks, n = [], 0
        while n <= max_bytes:
            chunk = os.read(fd, min(_CHUNK, max_bytes + 1 - n))
            if not chunk:
                break
            chunks.append(chunk)
            n += len(chunk)
        if n > max_bytes:
            raise InputRefused(f"{shown(path)} grew past {max_bytes} bytes while it was read")
        return b"".join(chunks)
    except OSError as exc:
        raise _refusal(path, exc) from None
    finally:
        os.close(fd)


def read_text(path: str | os.PathLike[str], max_bytes: int) -> str:
    """read_bytes decoded as UTF-8 (InputRefused where it is not)."""
    data = read_bytes(path, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputRefused(f"{shown(path)} is not UTF-8 text (byte {exc.start})") from None


def json_depth(text: str) -> int:
    """The deepest nesting of arrays and objects in JSON text, counted in one loop (no
    recursion: any depth is measured)."""
    depth = deepest = 0
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            deepest = max(deepest, depth)
        elif ch in "]}":
            depth -= 1
    return deepest


def loads(text: str, max_depth: int = MAX_JSON_DEPTH, source: str = "JSON") -> Any:
    """json.loads with the nesting bounded first; every way it fails is InputRefused."""
    if (depth := json_depth(text)) > max_depth:
        raise InputRefused(f"{source} nests {depth} levels deep; at most {max_depth}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InputRefused(f"{source} is not whole JSON (truncated?): {exc}") from None
    except (ValueError, RecursionError) as exc:  # a 5000-digit integer, say
        raise InputRefused(f"{source} is not usable JSON: {exc}") from None


def read_json(path: str | os.PathLike[str], max_bytes: int = MAX_JSON_BYTES,
              max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A JSON document from a file, bounded in size and depth (InputRefused otherwise)."""
    return loads(read_text(path, max_bytes), max_depth, shown(path))


@dataclass
class Walk:
    """What a folder walk found: the files wanted and what it left out, with the reason."""

    files: list[Path] = field(default_factory=list)
    skipped: list[tuple[Path, str]] = field(default_factory=list)


def walk_files(root: str | os.PathLike[str], suffix: str, max_depth: int, max_files: int,
               min_depth: int = 0, hidden: bool = False) -> Walk:
    """Regular files named *suffix under root, min_depth to max_depth folders deep (0: in
    root itself, 1: in its subfolders), sorted. Symbolic links are never followed (a link named
    *suffix, or to a folder, is left out and named); a FIFO, socket or device named
    *suffix is left out and named; a folder deeper than max_depth is left out and named.
    More than max_files such files, or 50 x as many entries, is InputRefused. Names that
    start with '_' or (unless hidden) '.' are no files of it."""
    out = Walk()
    todo = [(Path(root), 0)]
    seen = 0
    while todo:
        folder, depth = todo.pop()
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError as exc:
            out.skipped.append((folder, _why(folder, exc)))
            continue
        for e in entries:
            seen += 1
            if seen > 50 * max_files:
                raise InputRefused(f"{shown(root)} holds more than {50 * max_files} entries; "
                                   "not walked further")
            if e.name.startswith("_") or (e.name.startswith(".") and not hidden):
                continue
            path = Path(e.path)
            try:
                mode = e.stat(follow_symlinks=False).st_mode
            except OSError as exc:
                out.skipped.append((path, _why(path, exc)))
                continue
            if stat.S_ISDIR(mode):
                if depth < max_depth:
                    todo.append((path, depth + 1))
                else:
                    out.skipped.append((path, f"a folder deeper than {max_depth} level(s): "
                                              "not walked"))
            elif stat.S_ISLNK(mode):
                out.skipped.append((path, "a symbolic link: not followed"))
            elif not e.name.endswith(suffix):
                continue
            elif not stat.S_ISREG(mode):
                out.skipped.append((path, f"a {kind(mode)}, not a regular file"))
            elif depth >= min_depth:
                out.files.append(path)
                if len(out.files) > max_files:
                    raise InputRefused(f"{shown(root)} holds more than {max_files} *{suffix} "
                                       "files; not read")
    out.files.sort()
    return out
