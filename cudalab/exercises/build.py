"""Compiling a submission: nvcc's diagnostics with file and line, the kernel's signature
read back from the PTX, and static analysis (registers, shared memory, spills, occupancy at
the slot's block size) from ptxas -v through the framework's parser (cudalab.ptxas_info)
and cudalab's occupancy calculator.

The file is compiled alone, in a fresh temporary folder, with no include path, to a cubin
for one architecture; the judge loads that cubin and compiles none of the submission's
code itself. Every nvcc run on a submission is sandboxed where a sandbox can run (class
mode requires one; toolkit_jail, cudalab.jail): it sees the toolkit, the host compiler,
its folder and nothing else of the host, under time, memory, process and output limits; a
file it names elsewhere is simply not there. Before the compile, as a first friendly
message, the preprocessor is asked which files it opens (`nvcc -M`, host and device
passes, with the compile's own options): a file outside the CUDA toolkit's and the host
compiler's own include folders refuses the submission, however its #include was spelled.
"""

from __future__ import annotations

import functools
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from cudalab import jail, ptxas_info
from cudalab import occupancy as occ
from cudalab.exercises import ptx_stores
from cudalab.exercises.catalog import Exercise
from cudalab.exercises.toolkit_jail import limit_problem, run_nvcc
from cudalab.toolkit import find_nvcc

DEFAULT_ARCH = "sm_90"
_SAFE_FILE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}\.cu")
_DIAG = re.compile(r"^(?P<file>[^\s()][^()]*)\((?P<line>\d+)\): (?P<sev>error|warning|remark)"
                   r"(?: #[\w-]+)?: (?P<msg>.*)$")
_PTXAS = re.compile(r"^ptxas (?P<sev>error|warning|fatal)\s*: (?P<msg>.*)$")
_PARAMS = re.compile(r"\.param\s+\.(\w+)")


@dataclass
class Diagnostic:
    file: str
    line: int  # 0: no line (ptxas, the linker)
    severity: str
    message: str
    source: str = ""  # the submission's line, where it has one

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Build:
    ok: bool
    arch: str
    file: str  # the name nvcc's messages use
    cubin: bytes = b""
    diagnostics: list[Diagnostic] = field(default_factory=list)
    problem: str = ""  # why the build cannot be judged, though nvcc succeeded
    usage: dict[str, Any] = field(default_factory=dict)  # registers, smem, occupancy
    compiled: bool = False  # nvcc succeeded (ok is False only for a slot problem then)
    refused: str = ""  # why it was refused before the compile (a file it would read)
    sandboxed: bool = False  # nvcc ran in the sandbox (cudalab.jail)

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        del d["cubin"]
        return d


def display_name(path: Path) -> str:
    """The file name nvcc sees: the submission's own, where it is a plain name."""
    return path.name if _SAFE_FILE.fullmatch(path.name) else "submission.cu"


def nvcc_command(nvcc: str, ex: Exercise, name: str, arch: str, out: str,
                 keep_dir: str) -> list[str]:
    defines = [f"-D{k}={v}" for k, v in sorted(ex.defines.items())]
    return [nvcc, "-cubin", *ptxas_info.BASE_OPTIONS, f"-arch={arch}", "-Xptxas", "-v", "-keep",
            "-keep-dir", keep_dir, *defines, name, "-o", out]


def compile_submission(text: str, ex: Exercise, name: str = "submission.cu",
                       arch: str = DEFAULT_ARCH, nvcc: str | None = None,
                       sandbox: str = "optional") -> Build:
    """Compile `text` for `arch`: the cubin, nvcc's diagnostics, and the slot checks.
    `sandbox` (required|optional|off, cudalab.jail.use): whether nvcc runs in one."""
    nvcc = nvcc or find_nvcc()
    if nvcc is None:
        return Build(False, arch, name, problem="nvcc not found: install the CUDA toolkit "
                     "(or put its bin/ on PATH) to compile exercises")
    boxed = jail.use(sandbox)
    with tempfile.TemporaryDirectory(prefix="cudalab-ex-") as tmp:
        (Path(tmp) / name).write_text(text)
        refused = foreign_files(nvcc, ex, name, arch, Path(tmp), boxed)
        if refused:
            return Build(False, arch, name, refused=refused, sandboxed=boxed)
        cmd = nvcc_command(nvcc, ex, name, arch, "k.cubin", ".")
        out = run_nvcc(cmd, Path(tmp), boxed)
        log = out.output
        diags = parse_diagnostics(log, text)
        stopped = limit_problem(out)
        if out.returncode != 0 or stopped:
            if not stopped and not any(d.severity in ("error", "fatal") for d in diags):
                tail = " | ".join(log.strip().splitlines()[-3:])
                diags.append(Diagnostic(name, 0, "error", tail or f"nvcc exit {out.returncode}"))
            return Build(False, arch, name, diagnostics=diags, problem=stopped,
                         sandboxed=boxed)
        ptx = "".join(p.read_text() for p in Path(tmp).glob("*.ptx"))
        cubin = (Path(tmp) / "k.cubin").read_bytes()
    build = Build(True, arch, name, cubin, diags, compiled=True, sandboxed=boxed)
    build.problem = signature_problem(ex, ptx, log)
    if not build.problem:
        build.usage = static_usage(ex, log, ptx, arch)
        build.problem = build.usage.pop("problem", "")
    build.ok = not build.problem
    return build


def dependencies(make_rule: str) -> list[str]:
    """The files of a make rule as nvcc -M writes it (escaped spaces kept in names)."""
    body = make_rule.replace("\\\n", " ").split(":", 1)[-1]
    return [f.replace("\\ ", " ") for f in re.split(r"(?<!\\)\s+", body.strip()) if f]


def _opened(nvcc: str, ex: Exercise, name: str, arch: str, cwd: Path, boxed: bool
            ) -> tuple[list[str] | None, str]:
    """The files the preprocessor opens for cwd/name with the compile's options (resolved
    paths), or None and nvcc's first message about the file where -M failed."""
    cmd = nvcc_command(nvcc, ex, name, arch, "deps.d", ".")
    cmd = [c for c in cmd if c not in ("-cubin", "-keep", "-keep-dir", ".", "-Xptxas", "-v")]
    out = run_nvcc([*cmd[:1], "-M", *cmd[1:]], cwd, boxed)
    stopped = limit_problem(out, "the preprocessor")
    if stopped:
        return None, stopped
    deps = cwd / "deps.d"
    if out.returncode != 0 or not deps.exists():
        lines = out.output.splitlines()
        errors = [ln for ln in lines if "error" in ln]  # the file's own first, then nvcc's
        own = [ln for ln in errors if ln.startswith(name)] or errors \
            or [ln for ln in lines if ln.startswith(name)]
        return None, own[0] if own else f"nvcc -M exit {out.returncode}"
    files = dependencies(deps.read_text())
    deps.unlink()
    return [os.path.realpath(cwd / f) for f in files[1:]], ""  # files[0]: the target


@functools.lru_cache(maxsize=8)
def system_include_dirs(nvcc: str, arch: str, boxed: bool) -> tuple[str, ...]:
    """The folders of the toolkit's and the host compiler's headers: those an empty file
    opens (none inside another)."""
    from cudalab.exercises.catalog import get

    with tempfile.TemporaryDirectory(prefix="cudalab-ex-") as tmp:
        (Path(tmp) / "empty.cu").write_text("")
        files, why = _opened(nvcc, get("vector_add"), "empty.cu", arch, Path(tmp), boxed)
    if files is None:
        raise RuntimeError(f"nvcc -M fails on an empty file: {why}")
    dirs = sorted({os.path.dirname(f) for f in files if not f.endswith("empty.cu")})
    return tuple(d for d in dirs if not any(d.startswith(o + os.sep) for o in dirs))


def foreign_files(nvcc: str, ex: Exercise, name: str, arch: str, cwd: Path,
                  boxed: bool = False) -> str:
    """'' where the preprocessor opens only the submission and the toolkit's and system's
    headers, else why the submission is refused."""
    files, why = _opened(nvcc, ex, name, arch, cwd, boxed)
    if files is None:
        return f"the preprocessor failed on the file, so what it reads is unknown: {why}"
    own = os.path.realpath(cwd / name)
    roots = system_include_dirs(nvcc, arch, boxed)
    outside = [f for f in files
               if f != own and not any(f.startswith(r + os.sep) for r in roots)]
    if not outside:
        return ""
    return (f"{name} makes the compiler read {len(outside)} file(s) besides CUDA's and the "
            "system's headers: a submission is compiled alone, so it may not include "
            "other files, however the #include is spelled")


def parse_diagnostics(log: str, text: str) -> list[Diagnostic]:
    """nvcc's and ptxas' errors and warnings, each with the submission's line."""
    lines = text.splitlines()
    out = []
    for raw in log.splitlines():
        m = _DIAG.match(raw.strip())
        if m:
            ln = int(m.group("line"))
            src = lines[ln - 1].strip() if 0 < ln <= len(lines) else ""
            out.append(Diagnostic(m.group("file"), ln, m.group("sev"), m.group("msg"), src))
            continue
        m = _PTXAS.match(raw.strip())
        if m:
            out.append(Diagnostic("ptxas", 0, "error" if m.group("sev") == "fatal"
                                  else m.group("sev"), m.group("msg")))
    return out


def ptx_params(ptx: str, kernel: str) -> list[str] | None:
    """The PTX types of an entry's parameters (u64 for a pointer, u32 for an int), or None
    where the PTX has no entry of that name."""
    m = re.search(rf"\.entry\s+{re.escape(kernel)}\s*\(([^)]*)\)", ptx)
    return None if m is None else _PARAMS.findall(m.group(1))


def signature_problem(ex: Exercise, ptx: str, log: str) -> str:
    """'' where the slot's kernel is there with the slot's parameters, else what is wrong."""
    params = ptx_params(ptx, ex.kernel)
    if params is None:
        report = ptxas_info.parse_ptxas(log)
        if ptxas_info.find_kernel(report, ex.kernel) is not None:
            return (f"kernel {ex.kernel} is compiled as C++ (its name is mangled): declare "
                    f"it extern \"C\" as in the starter: {ex.signature}")
        found = ", ".join(sorted(report)) or "none"
        return (f"no kernel called {ex.kernel} (kernels found: {found}); keep the starter's "
                f"signature: {ex.signature}")
    if tuple(params) != ex.params:
        return (f"{ex.kernel} takes ({', '.join(params)}) in PTX, the slot passes "
                f"({', '.join(ex.params)}): keep the signature {ex.signature}")
    return ""


def static_usage(ex: Exercise, log: str, ptx: str, arch: str) -> dict[str, Any]:
    """Registers, shared memory, spills (ptxas) and occupancy at the slot's block size."""
    from cudalab.exercises.slots import block_threads

    usage = ptxas_info.find_kernel(ptxas_info.parse_ptxas(log), ex.kernel) or {}
    bound = ptxas_info.parse_maxntid(ptx).get(ex.kernel, 0)
    threads = block_threads(ex, ex.class_size)
    out: dict[str, Any] = {
        "registers": usage.get("registers", 0), "smem_static": usage.get("smem_static", 0),
        "spill_stores": usage.get("spill_stores", 0), "spill_loads": usage.get("spill_loads", 0),
        "stack": usage.get("stack", 0), "launch_bounds": bound, "threads": threads,
        "global_stores": ptx_stores.global_stores(ptx, ex.kernel),  # 0: output never written
    }
    if bound and threads > bound:
        out["problem"] = (f"__launch_bounds__({bound}) is below the slot's {threads} threads "
                          "a block: the launch would fail")
        return out
    o = occ.occupancy(arch, threads, out["registers"], out["smem_static"],
                      barriers=usage.get("barriers", 1))
    out |= {"occupancy": o.occupancy, "limiter": o.limiter, "active_blocks": o.active_blocks}
    if not o.launchable:
        out["problem"] = f"no block of {threads} threads fits an SM: {o.reason}"
    return out
