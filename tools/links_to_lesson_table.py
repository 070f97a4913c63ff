"""The interconnect lesson's table rows from a links.csv of `python -m cudalab.links` (what
`cudalab accept` measured on a multi-GPU machine), for a reference the lesson's claims are
judged on before a run of the lesson itself is committed. Every number comes from the
links.csv; the GPU's name and compute capability are given (they are in the same session's
logs), and the topology is the session's `nvidia-smi topo -m`. Times are links' medians: one
sample per point, no trials.

    python tools/links_to_lesson_table.py LINKS.csv TOPO.txt "NVIDIA H200" 9.0 OUT.csv
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pandas as pd

from cudalab import links, results, safe_text
from cudalab.experiments import REGISTRY
from cudalab.experiments.interconnect import spec


def table(df: pd.DataFrame, topo_text: str, gpu_name: str, cc: str) -> pd.DataFrame:
    exp = REGISTRY["interconnect"]
    gpus = sorted(set(df["src"]) | set(df["dst"]))
    size = int(df[df["mode"] != "bidirectional"]["bytes"].iloc[0])
    block = {**exp.settings_in(None), "size_mib": size >> 20}
    topo = links.topology(topo_text)
    rows = []
    for p in exp._points(block, gpus):
        row = {"experiment": exp.name, "variant": p.variant, "point_id": p.point_id,
               "gpu_name": gpu_name, "compute_capability": cc,
               **{f"p_{k}": v for k, v in p.params.items()}}
        if p.variant == "topology":
            rows.append(row | {"status": "ok", "m_gpus": len(gpus),
                               "m_nvidia_smi_topo": topo_text})
            continue
        got = df[(df["src"] == p.params["src"]) & (df["dst"] == p.params["dst"])
                 & (df["mode"] == p.variant)].iloc[0]
        link = topo.get((p.params["src"], p.params["dst"]), "")
        ok = bool(got["correct"]) and math.isfinite(got["gbps"])
        row |= {"status": "ok" if ok else "skipped",
                "reason": "" if ok else str(got["note"]), "time_median_s": got["seconds"],
                "bytes": got["bytes"], "gbps": got["gbps"] if ok else math.nan}
        row |= {f"m_{k}": v for k, v in spec.metrics(link, cc, p.variant, True,
                                                     [math.nan, math.nan]).items()}
        rows.append(row)
    out = pd.DataFrame(rows)
    extra = [c for c in out.columns if c not in results.COLUMNS]
    return out.reindex(columns=[*results.COLUMNS, *extra])


def main(argv: list[str]) -> int:
    if len(argv) != 5:
        print(__doc__, file=sys.stderr)
        return 2
    src, topo, name, cc, out = argv
    t = table(pd.read_csv(src), Path(topo).read_text(), name, cc)
    safe_text.write_frame(t, Path(out))
    print(f"{out}: {len(t)} rows")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
