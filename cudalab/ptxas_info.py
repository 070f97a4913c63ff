"""nvcc's options as the GPU session compiles, and what ptxas -v and the PTX say of a build:
each kernel's registers, shared memory, stack and spills, and its .maxntid bound. Shared by
the static-analysis lesson (every kernel of cuda/) and the exercises (a submission's build).
"""

from __future__ import annotations

import re

from cudalab import nvcc_flags

BASE_OPTIONS = ["-O3", "-lineinfo"]  # what GpuSession.compile passes, before the -D flags


def flag_tokens(flags: str) -> list[str]:
    """'TILE=32 FAST --use_fast_math' -> ['-DTILE=32', '-DFAST', '--use_fast_math'] (only
    the option families cudalab.nvcc_flags allows)."""
    return nvcc_flags.tokens(flags)


def nvcc_options(flags: str, arch: str) -> list[str]:
    return [*BASE_OPTIONS, f"-arch={arch}", "-Xptxas", "-v", *flag_tokens(flags)]


_MAXNTID_ENTRY = re.compile(r"\.entry\s+(\w+)\s*\((?:[^)]*)\)([^{]*)\{")


_MAXNTID = re.compile(r"\.maxntid\s+(\d+)\s*,\s*(\d+)\s*,\s*(\d+)")


def parse_maxntid(ptx: str) -> dict[str, int]:
    """PTX -> {kernel: threads per block its __launch_bounds__ allow} for the kernels that
    declare one (`.maxntid x, y, z` between an entry's parameters and its body)."""
    out = {}
    for m in _MAXNTID_ENTRY.finditer(ptx):
        b = _MAXNTID.search(m.group(2))
        if b:
            x, y, z = (int(v) for v in b.groups())
            out[m.group(1)] = x * y * z
    return out


_ENTRY = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")


_PROPS = re.compile(r"Function properties for (\S+)")


_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")


_USED = re.compile(r"Used (\d+) registers")


_FIELDS = {
    "barriers": re.compile(r"used (\d+) barriers"),
    "smem_static": re.compile(r"(\d+) bytes smem"),
    "cmem0": re.compile(r"(\d+) bytes cmem\[0\]"),
    "local": re.compile(r"(\d+) bytes lmem"),
}


def parse_ptxas(text: str) -> dict[str, dict[str, int]]:
    """ptxas -v output -> {kernel: {registers, smem_static, cmem0, stack, spill_stores,
    spill_loads, barriers, local}} for every entry function."""
    out: dict[str, dict[str, int]] = {}
    entry = None
    props_for = None
    frames: dict[str, tuple[int, int, int]] = {}
    for line in text.splitlines():
        m = _ENTRY.search(line)
        if m:
            entry = m.group(1)
            out.setdefault(entry, {"registers": 0, "smem_static": 0, "cmem0": 0, "stack": 0,
                                   "spill_stores": 0, "spill_loads": 0, "barriers": 0,
                                   "local": 0})
            continue
        m = _PROPS.search(line)
        if m:
            props_for = m.group(1)
            continue
        m = _FRAME.search(line)
        if m and props_for:
            frames[props_for] = tuple(int(x) for x in m.groups())
            props_for = None
            continue
        m = _USED.search(line)
        if m and entry:
            u = out[entry]
            u["registers"] = int(m.group(1))
            for k, rx in _FIELDS.items():
                f = rx.search(line)
                if f:
                    u[k] = int(f.group(1))
    for name, (stack, st, ld) in frames.items():
        if name in out:
            out[name] |= {"stack": stack, "spill_stores": st, "spill_loads": ld}
    return out


def find_kernel(report: dict[str, dict[str, int]], kernel: str) -> dict[str, int] | None:
    """The report of `kernel` (extern "C" name, or a C++-mangled _Z<len><name>...)."""
    if kernel in report:
        return report[kernel]
    mangled = f"_Z{len(kernel)}{kernel}"
    for name, usage in report.items():
        if name.startswith(mangled):
            return usage
    return None
