"""The CUDA toolkit a config names (experiments.static_analysis.nvcc): what it can build and
whether a job may run it, decided by reading files, never by running the toolkit.

Checking a config must execute nothing the config names: a path in a config is text anyone
who can write that file chose, and a "compiler" planted in a world-writable folder would run
with the checker's rights. So `cudalab validate` / `plan` and the Snakefile's parse read:

- the architectures a toolkit can build come from a static table of CUDA releases
  (KNOWN_ARCHS) and the toolkit's version, read from its version.json, version.txt or
  include/cuda.h next to nvcc's bin/ folder;
- whether the toolkit may run at all comes from the owner and mode of nvcc and of every
  folder above it (untrusted_reasons).

Only a job runs the toolkit, and only after untrusted_reasons found nothing.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
from pathlib import Path

from cudalab.keys import show

Version = tuple[int, int]

# First and last CUDA release whose nvcc builds each target (None: still supported). From
# the CUDA toolkit release notes: Kepler sm_30 went in 11.0, sm_35/sm_37 in 12.0, Maxwell to
# Volta (sm_50 ... sm_72) in 13.0.
KNOWN_ARCHS: dict[str, tuple[Version, Version | None]] = {
    "sm_30": ((6, 0), (10, 2)), "sm_35": ((5, 0), (11, 8)), "sm_37": ((6, 5), (11, 8)),
    "sm_50": ((6, 0), (12, 9)), "sm_52": ((6, 5), (12, 9)), "sm_53": ((7, 0), (12, 9)),
    "sm_60": ((8, 0), (12, 9)), "sm_61": ((8, 0), (12, 9)), "sm_62": ((8, 0), (12, 9)),
    "sm_70": ((9, 0), (12, 9)), "sm_72": ((10, 0), (12, 9)), "sm_75": ((10, 0), None),
    "sm_80": ((11, 0), None), "sm_86": ((11, 1), None), "sm_87": ((11, 4), None),
    "sm_89": ((11, 8), None), "sm_90": ((11, 8), None), "sm_100": ((12, 8), None),
    "sm_120": ((12, 8), None),
}
# A version file is a few KB; cuda.h defines CUDA_VERSION in its first few hundred lines.
_MAX_READ = 262_144
_CUDA_H_VERSION = re.compile(r"^#define\s+CUDA_VERSION\s+(\d+)\s*$", re.M)
# a wrapper's line that runs another nvcc by its absolute path
_WRAPPER_EXEC = re.compile(r"^\s*exec\s+['\"]?(/[^\s'\";&|]*/nvcc)['\"]?(?:\s|$)", re.M)


def find_nvcc(name: str = "nvcc") -> str | None:
    """`name` on PATH (or a path), else the toolkit's usual homes: $CUDA_HOME/bin,
    $CUDA_PATH/bin, /usr/local/cuda/bin, the newest /usr/local/cuda-*/bin."""
    found = shutil.which(name)
    if found or name != "nvcc":
        return found
    import glob

    homes = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""),
             "/usr/local/cuda",
             *sorted(glob.glob("/usr/local/cuda-*"), key=_version_key, reverse=True)]
    for h in homes:
        cand = Path(h) / "bin" / "nvcc" if h else None
        if cand is not None and os.access(cand, os.X_OK):
            return str(cand)
    return None


def _version_key(path: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", Path(path).name))


def buildable(version: Version) -> list[str]:
    """The targets of KNOWN_ARCHS that the nvcc of CUDA `version` builds."""
    return [a for a, (first, last) in KNOWN_ARCHS.items()
            if first <= version and (last is None or version <= last)]


def archs_of(nvcc: str) -> list[str]:
    """The targets the toolkit of nvcc builds, from its release; [] where none is found."""
    version, _ = toolkit_version(nvcc)
    return buildable(version) if version else []


def toolkit_version(nvcc: str) -> tuple[Version | None, str]:
    """(major, minor) of the toolkit nvcc belongs to and the file it was read from, or
    (None, what was looked for). Read, not run: <root>/version.json (CUDA 11.1+),
    <root>/version.txt (older), <root>/include/cuda.h or <root>/targets/*/include/cuda.h,
    where <root> is the folder above nvcc's bin/ (as given, with symlinks resolved, and that
    of the nvcc a wrapper script execs)."""
    roots = list(dict.fromkeys(Path(p).parent.parent for p in toolkit_programs(nvcc)))
    for root in roots:
        headers = [root / "include/cuda.h", *sorted(root.glob("targets/*/include/cuda.h"))]
        for path, parse in ((root / "version.json", _from_json),
                            (root / "version.txt", _from_txt),
                            *((h, _from_cuda_h) for h in headers)):
            text = _read_small(path)
            found = parse(text) if text is not None else None
            if found is not None:
                return found, str(path)
    where = " or ".join(str(r) for r in roots)
    return None, f"no version.json, version.txt or include/cuda.h in {where}"


def toolkit_programs(nvcc: str) -> list[str]:
    """nvcc as given, with symlinks resolved, and the nvcc it execs when it is a small
    wrapper script (`exec /opt/cuda/bin/nvcc "$@"`, as some sites and images install):
    every program a job running `nvcc` would start, found by reading."""
    paths = [os.path.abspath(nvcc), os.path.realpath(nvcc)]
    text = _read_small(Path(paths[1]), limit=4096)
    if text is not None and text.startswith("#!"):
        m = _WRAPPER_EXEC.search(text)
        if m:
            paths += [m.group(1), os.path.realpath(m.group(1))]
    return list(dict.fromkeys(paths))


def _from_json(text: str) -> Version | None:
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past Python's stack
        return None
    for key in ("cuda_nvcc", "cuda"):  # nvcc's own version first
        entry = doc.get(key) if isinstance(doc, dict) else None
        v = entry.get("version") if isinstance(entry, dict) else None
        if isinstance(v, str):
            return _major_minor(v)
    return None


def _from_txt(text: str) -> Version | None:
    m = re.search(r"CUDA Version (\d+\.\d+)", text)
    return _major_minor(m.group(1)) if m else None


def _from_cuda_h(text: str) -> Version | None:
    m = _CUDA_H_VERSION.search(text)
    return (int(m.group(1)) // 1000, int(m.group(1)) % 1000 // 10) if m else None


def _major_minor(text: str) -> Version | None:
    m = re.match(r"(\d+)\.(\d+)", text)
    return (int(m.group(1)), int(m.group(2))) if m else None


def _read_small(path: Path, limit: int = _MAX_READ) -> str | None:
    """The start of a regular file (a FIFO or device named version.json is not waited on or
    read whole), or None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        return os.read(fd, limit).decode("utf-8", errors="replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def config_problems(key: str, name: str, nvcc: str | None, archs: list[str],
                    notes: list[str]) -> list[str]:
    """The messages of a config's nvcc (`name` as the config gives it, `nvcc` the program
    it names, None where not found): an executable file a job may run, whose release builds
    every one of `archs`; what cannot be checked here goes to `notes`. Nothing is run."""
    if os.sep in name and not (os.path.isfile(name) and os.access(name, os.X_OK)):
        what = "does not exist" if not os.path.exists(name) else "is not an executable file"
        return [f"{key}.nvcc: {show(name)} {what}; allowed: the path of an executable nvcc, or a "
                f"name on PATH"]
    if nvcc is None:
        notes.append(f"{key}.archs not checked: no {name!r} on PATH or in the usual CUDA "
                     f"homes here (static analysis needs it when it runs)")
        return []
    reasons = untrusted_reasons(nvcc)
    if reasons:
        return [f"{key}.nvcc: {show(nvcc)} would be refused by the job that runs it: "
                f"{'; '.join(reasons)}; allowed: an nvcc in folders that only root or you "
                f"can write"]
    version, source = toolkit_version(nvcc)
    if version is None:
        notes.append(f"{key}.archs checked against every architecture cudalab knows, not "
                     f"against {nvcc}'s release: {source}")
        return []
    can = buildable(version)
    return [f"{key}.archs[{i}]: {a!r} cannot be built by CUDA {version[0]}.{version[1]} "
            f"({nvcc}, release read from {source}); allowed with this toolkit: "
            f"{', '.join(can)}" for i, a in enumerate(archs) if a not in can]


# -- may a job run it ------------------------------------------------------------------------
def untrusted_reasons(path: str) -> list[str]:
    """Why a program at `path` must not be run ([]: it may): the file or a folder above it
    (on the path as given, the resolved one, and those of the nvcc a wrapper script execs)
    is writable by everyone, or is owned by a user other than root and the one running
    cudalab. A sticky world-writable folder such as
    /tmp counts too: the sticky bit stops others from replacing an existing file, not from
    creating the name first."""
    me = os.geteuid()
    trusted = {0, me, *trusted_owners()}
    seen: set[Path] = set()
    reasons: list[str] = []
    for chain in map(Path, toolkit_programs(path)):
        for part in (chain, *chain.parents):
            if part in seen:
                continue
            seen.add(part)
            try:
                st = os.lstat(part)
            except OSError as exc:
                reasons.append(f"{part} cannot be examined ({exc.strerror})")
                continue
            if st.st_uid not in trusted:
                reasons.append(f"{part} is owned by {_user(st.st_uid)}, neither root nor "
                               f"the user running cudalab ({_user(me)}) nor one named in "
                               f"{TRUSTED_OWNERS_ENV}")
            # a symlink's own mode is always rwxrwxrwx and means nothing; its target is
            # checked on the resolved chain
            if not stat.S_ISLNK(st.st_mode) and st.st_mode & stat.S_IWOTH:
                sticky = " (the sticky bit does not help: anyone may create a name there)" \
                    if st.st_mode & stat.S_ISVTX else ""
                reasons.append(f"{part} is writable by every user (mode "
                               f"{stat.S_IMODE(st.st_mode):o}){sticky}")
    return reasons


# A site whose toolkits belong to a software account (spack, apps) names it here, in the
# environment of whoever runs cudalab: never in a config, which may come from someone else.
TRUSTED_OWNERS_ENV = "CUDALAB_TRUSTED_TOOLKIT_OWNERS"


def trusted_owners() -> set[int]:
    """The uids of the accounts CUDALAB_TRUSTED_TOOLKIT_OWNERS names (user names or uids,
    comma-separated); a name this machine does not know is left out."""
    out: set[int] = set()
    for name in filter(None, (n.strip() for n in
                              os.environ.get(TRUSTED_OWNERS_ENV, "").split(","))):
        if name.isdigit():
            out.add(int(name))
            continue
        try:
            import pwd

            out.add(pwd.getpwnam(name).pw_uid)
        except (ImportError, KeyError):
            continue
    return out


def _user(uid: int) -> str:
    try:
        import pwd

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def refusal(path: str, reasons: list[str]) -> str:
    """One message: what is refused and why, and what to do."""
    return (f"refusing to run {path}: {'; '.join(reasons)}. Another user could have put "
            f"any program there; use a toolkit in folders that only root or you can write "
            f"(e.g. /usr/local/cuda/bin/nvcc)")


def check_result(path: str) -> str:
    """The trust check's verdict in one line, for provenance."""
    reasons = untrusted_reasons(path)
    if reasons:
        return "refused: " + "; ".join(reasons)
    return "ok: it and every folder above it are owned by root or this user, none world-writable"
