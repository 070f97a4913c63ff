"""A cache of nvcc builds across runs, in the user's cache folder.

Static analysis compiles every kernel file once per compile variant and target; the same
source, flags, target and toolkit always give the same ptxas report, so a second run (or a
second checkout) reads the report instead of running nvcc again. One JSON file per build:

    $CUDALAB_BUILD_CACHE, else $XDG_CACHE_HOME/cudalab/builds, else ~/.cache/cudalab/builds
        <2 hex>/<64 hex>.json   {"report": ..., "seconds": ..., "file", "flags", "arch", ...}

The name is the sha256 of everything the build reads: the source bytes and those of every
header it includes from its own folder (recursively), the nvcc options, the target and the
toolkit (the real path, size and modification time of nvcc, cicc, ptxas and the toolkit's
version.json: an upgrade or another toolkit is another key, and no nvcc runs to tell).

Entries are written through results.atomic_path (a temp file, one rename): jobs that build the
same entry at once each write a whole file and the last rename wins, and a reader never sees
half an entry, so concurrent jobs need no lock. After each write the folder is held to
MAX_ENTRIES files (the least recently written go first); deleting the folder is always safe.
`CUDALAB_BUILD_CACHE=off` (or the config's `experiments.static_analysis.cache: false`) turns
the cache off.

Each entry keeps the CPU seconds its build took; estimates read those (`measured_seconds`),
so the plan's time for a compile comes from this machine's own builds.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cudalab.results import atomic_path

ENV = "CUDALAB_BUILD_CACHE"
OFF_WORDS = ("off", "0", "false", "no", "none")
# About 1 KB each: 2000 builds are ~2 MB, room for ~25 versions of the default grid's 70.
MAX_ENTRIES = 2000
FORMAT = 1  # bump when an entry's meaning changes: old entries are then never read
_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def default_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "cudalab" / "builds"


def root(enabled: bool = True) -> Path | None:
    """The cache folder, or None when the cache is off (config or CUDALAB_BUILD_CACHE)."""
    env = os.environ.get(ENV, "").strip()
    if not enabled or env.lower() in OFF_WORDS:
        return None
    return Path(env).expanduser() if env else default_root()


def source_bytes(path: Path, include_dirs: Iterable[Path] = ()) -> bytes:
    """The file's bytes followed by those of every `#include "..."` it reaches (found beside
    the including file or in include_dirs), each once, in the order first met. System
    headers (<...>) belong to the toolkit and are covered by its identity."""
    dirs = [Path(d) for d in include_dirs]
    seen: set[Path] = set()
    out: list[bytes] = []

    def visit(p: Path) -> None:
        p = p.resolve()
        if p in seen:
            return
        seen.add(p)
        data = p.read_bytes()
        out.append(p.name.encode() + b"\0" + data + b"\0")
        for name in _INCLUDE.findall(data.decode("utf-8", "replace")):
            for d in (p.parent, *dirs):
                if (d / name).is_file():
                    visit(d / name)
                    break

    visit(path)
    return b"".join(out)


def toolkit_id(nvcc: str) -> str:
    """What identifies the toolkit behind `nvcc` without running it: the real path, size and
    mtime of nvcc and of the cicc, ptxas and version.json of its toolkit where present."""
    real = Path(os.path.realpath(nvcc))
    home = real.parent.parent
    parts = []
    for p in (real, home / "nvvm" / "bin" / "cicc", real.parent / "ptxas",
              home / "version.json"):
        try:
            st = p.stat()
        except OSError:
            continue
        parts.append(f"{p}:{st.st_size}:{st.st_mtime_ns}")
    return "|".join(parts)


def build_key(source: bytes, options: list[str], arch: str, toolkit: str) -> str:
    h = hashlib.sha256()
    for part in (str(FORMAT).encode(), source, "\0".join(options).encode(), arch.encode(),
                 toolkit.encode()):
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()


@dataclass(frozen=True)
class Build:
    """One build's ptxas report and where it came from."""

    report: dict[str, dict[str, int]]
    seconds: float  # CPU seconds nvcc and its children took (a hit: those of the build)
    cached: bool
    key: str


class BuildCache:
    def __init__(self, folder: Path | None, max_entries: int = MAX_ENTRIES) -> None:
        self.folder = folder
        self.max_entries = max_entries

    def _path(self, key: str) -> Path:
        assert self.folder is not None
        return self.folder / key[:2] / f"{key}.json"

    def get(self, key: str) -> Build | None:
        """The entry under `key`; None when absent, off, or unreadable (a damaged entry is a
        miss, rebuilt and rewritten)."""
        if self.folder is None:
            return None
        try:
            entry = json.loads(self._path(key).read_text())
            report = entry["report"]
            if not (isinstance(report, dict) and all(isinstance(u, dict)
                                                     for u in report.values())):
                return None
            return Build(report, float(entry["seconds"]), True, key)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None

    def put(self, key: str, build: Build, **about: Any) -> None:
        """Store a build (no-op when off); a cache that cannot be written never fails the
        build it holds."""
        if self.folder is None:
            return
        entry = {"report": build.report, "seconds": round(build.seconds, 3),
                 "written": time.time(), **about}
        try:
            with atomic_path(self._path(key)) as tmp:
                tmp.write_text(json.dumps(entry, sort_keys=True))
            self.prune()
        except OSError:
            pass

    def entries(self) -> list[Path]:
        if self.folder is None or not self.folder.is_dir():
            return []
        return list(self.folder.glob("??/*.json"))

    def prune(self) -> int:
        """Delete the oldest entries beyond max_entries; how many went."""
        files = self.entries()
        if len(files) <= self.max_entries:
            return 0
        def mtime(p: Path) -> float:
            try:
                return p.stat().st_mtime
            except OSError:
                return 0.0
        extra = sorted(files, key=mtime)[:len(files) - self.max_entries]
        for p in extra:
            p.unlink(missing_ok=True)
        return len(extra)

    def measured_seconds(self) -> dict[tuple[str, str, str], float]:
        """(file, flags, arch) -> the latest build CPU time the entries record (any source
        version or toolkit: the best guess for the next build of the same thing)."""
        latest: dict[tuple[str, str, str], tuple[float, float]] = {}
        for p in self.entries():
            try:
                e = json.loads(p.read_text())
                k = (str(e["file"]), str(e["flags"]), str(e["arch"]))
                when, secs = float(e["written"]), float(e["seconds"])
            except (OSError, ValueError, KeyError, TypeError):
                continue
            if k not in latest or when > latest[k][0]:
                latest[k] = (when, secs)
        return {k: s for k, (_, s) in latest.items()}
