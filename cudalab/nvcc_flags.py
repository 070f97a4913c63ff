"""The nvcc options a compile variant may carry: an allow-list of flag families.

A compile variant ("TILE=32 --use_fast_math") comes from a config or a kernel file's
`// cudalab-variant:` line and ends up on nvcc's command line (as a list, never through a
shell). nvcc has options that run other programs or write elsewhere (`-ccbin`,
`-Xcompiler=-fplugin=...`, `--output-directory`, `-odir`, `--run`), so a variant may only
use the families below, with their values checked. A bare NAME or NAME=VALUE is a macro
(-DNAME=VALUE), which is how the kernels take their tile sizes.
"""

from __future__ import annotations

import re
import shlex

_IDENT = r"[A-Za-z_][A-Za-z0-9_]{0,63}"
_VALUE = r"[A-Za-z0-9_.+-]{0,64}"
_BOOL_FLAGS = ("ftz", "prec-div", "prec-sqrt", "fmad")
_PTXAS_OPTS = r"(-v|--verbose|-O[0-3]|--warn-on-spills|-warn-spills|-dlcm=c[ag]|-dscm=(wt|cg))"

# Each family: a full-match pattern for one token.
FAMILIES: dict[str, str] = {
    "NAME or NAME=VALUE (a macro, as -DNAME=VALUE)": rf"{_IDENT}(={_VALUE})?",
    "-DNAME[=VALUE], -UNAME": rf"-D{_IDENT}(={_VALUE})?|-U{_IDENT}",
    "-O0 ... -O3": r"-O[0-3]",
    "--use_fast_math": r"--?use_fast_math",
    "--maxrregcount=N (16 ... 255)":
        r"--?maxrregcount=(1[6-9]|[2-9][0-9]|1[0-9]{2}|2[0-4][0-9]|25[0-5])",
    "--ftz, --prec-div, --prec-sqrt, --fmad =true|false":
        rf"--?({'|'.join(_BOOL_FLAGS)})=(true|false)",
    "-lineinfo, --extra-device-vectorization, --restrict":
        r"--?(lineinfo|extra-device-vectorization|restrict)",
    "-Xptxas=-v|-O0..3|--warn-on-spills|-dlcm=ca|cg (comma-separated)":
        rf"-Xptxas={_PTXAS_OPTS}(,{_PTXAS_OPTS})*",
    "-arch=sm_NN / compute_NN": r"(-arch|--gpu-architecture)=(sm|compute)_[0-9]{2,3}[af]?",
    "-std=c++11|14|17|20": r"-std=c\+\+(11|14|17|20)",
}
_FULL = [re.compile(p) for p in FAMILIES.values()]
ALLOWED = "; ".join(FAMILIES)


def problems(flags: str) -> list[str]:
    """What is wrong with one variant string ([] when every token is allowed)."""
    try:
        toks = shlex.split(flags)
    except ValueError as exc:
        return [f"{flags!r} cannot be split into options ({exc})"]
    bad = []
    i = 0
    while i < len(toks):
        tok = toks[i]
        if tok in ("-Xptxas", "--ptxas-options") and i + 1 < len(toks):
            tok, i = f"-Xptxas={toks[i + 1]}", i + 1  # the option's value is the next token
        if not any(p.fullmatch(tok) for p in _FULL):
            bad.append(tok)
        i += 1
    return [f"{b!r} is not an allowed nvcc option; allowed: {ALLOWED}" for b in bad]


def tokens(flags: str) -> list[str]:
    """'TILE=32 FAST --use_fast_math' -> ['-DTILE=32', '-DFAST', '--use_fast_math'].
    Raises ValueError for a variant outside the allow-list."""
    bad = problems(flags)
    if bad:
        raise ValueError(f"compile variant {flags!r}: {bad[0]}")
    out = []
    for tok in shlex.split(flags):
        out.append(tok if tok.startswith("-") else f"-D{tok}")
    return out
