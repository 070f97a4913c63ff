"""Node acceptance: the same small grid on every GPU of this machine at once, each GPU judged
against the others with compare's noise-aware verdict, plus what its telemetry and NVML say
(throttling during the run, ECC errors that appeared, rows waiting for remapping).

Each GPU gets its own run folder (<out>/gpu<index>/) and one process that measures the
grid's experiments there, pinned to that GPU by gpu_slots (a `gpus: [index]` config), so
the GPUs work in parallel and never share a job. A GPU is compared with the *median of the
other GPUs* (per point: the median time and spread of the others): a slow GPU then cannot
pull its own reference toward itself, which with two GPUs would halve what is seen.
A GPU is an outlier where any kernel point is `slower` beyond the bar, or its telemetry
flagged throttling, or an ECC count rose, or NVML reports rows pending remapping.

    cudalab accept [--config config.yaml] [--out accept]   ->  accept.csv, accept.html
"""

from __future__ import annotations

import copy
import html
import math
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pandas as pd

from cudalab import compare, gpu_slots, result_folders, results, safe_text
from cudalab import config as cfg
from cudalab.gpu import PLANT_ENV
from cudalab.gpu_slots import Gpu
from cudalab.links import MODES, slow_pairs
from cudalab.links import SLOW_LINK as SLOW_SHARE

# A grid of large points only (kernels of 100 us or more, copies of 256 MiB): small points
# are dominated by launch and host noise, which says nothing about the GPU.
GRID: dict[str, dict[str, Any]] = {
    "vector_add": {"sizes": [67108864], "threads": [256], "probe_blocks": []},  # no probe
    "coalescing": {"n": 67108864, "offsets": [0], "strides": [1, 32],
                   "transpose_sizes": [4096],
                   "variants": ["memcpy", "copy", "stride", "transpose_tiled"]},
    "matmul": {"sizes": [2048], "variants": ["tiled", "register", "cublas"], "tiles": [32],
               "register_tiles": [{"rt": 8, "bt": 128, "bk": 8}], "dtypes": ["float32"],
               "end_to_end": False},
    "transfer": {"min_bytes": 268435456, "max_bytes": 268435456, "memory": ["pinned"]},
}
KERNEL_CLASSES = ("kernel", "small-grid")  # host-bound points' verdicts never flag a GPU
PLANTED = "-Xptxas -O0"  # the check of the check: unoptimised machine code, kernels slower


def grid_config(base: dict[str, Any], gpu: Gpu) -> dict[str, Any]:
    """The acceptance grid with the base config's harness and telemetry, pinned to `gpu`."""
    c = copy.deepcopy(base)
    c["experiments"] = {name: {**block, "enabled": True} for name, block in GRID.items()}
    c["gpus"] = [gpu.index]
    c["gpu_index"] = 0
    c["run_name"] = f"accept-gpu{gpu.index}"
    return cfg.validate(c)


def measure_gpu(config: dict[str, Any], gpu: Gpu, folder: Path, log: Path,
                plant: str = "") -> int:
    """Every experiment of the grid on one GPU, one after the other; the exit status of the
    first that failed (0: all ran). `plant`: nvcc options that make this GPU's kernels
    slower on purpose (the check of the check)."""
    folder.mkdir(parents=True, exist_ok=True)
    conf = folder / "config.json"
    results.write_json_atomic(conf, config)
    # pinned by UUID here, not only by the config's gpus: list: inside a Slurm job
    # gpu_slots leaves pinning to the allocation, which gives this job every GPU of the node
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": gpu.uuid, **({PLANT_ENV: plant} if plant else {})}
    rc = 0
    with open(log, "w") as out:
        for name in cfg.enabled_experiments(config):
            r = subprocess.run([sys.executable, "-m", "cudalab.cli", "measure", name, "--config",
                                str(conf), "--results", str(folder)], stdout=out,
                               stderr=subprocess.STDOUT, env=env)
            rc = rc or r.returncode
    return rc


def nvml_health(gpus: list[Gpu], nvml: Any = None) -> dict[str, dict[str, Any]]:
    """Per GPU UUID: volatile ECC counts (corrected, uncorrected) and remapped-row flags,
    where NVML has them; {} per GPU where it does not (no NVML, ECC off)."""
    out: dict[str, dict[str, Any]] = {g.uuid: {} for g in gpus}
    try:
        if nvml is None:
            import pynvml as nvml
        nvml.nvmlInit()
    except Exception:  # noqa: BLE001 - no NVML: nothing to read
        return out
    for g in gpus:
        facts: dict[str, Any] = {}
        try:
            h = nvml.nvmlDeviceGetHandleByUUID(g.uuid.encode())
        except Exception:  # noqa: BLE001
            continue
        for key, kind in (("ecc_corrected", "NVML_MEMORY_ERROR_TYPE_CORRECTED"),
                          ("ecc_uncorrected", "NVML_MEMORY_ERROR_TYPE_UNCORRECTED")):
            try:
                facts[key] = int(nvml.nvmlDeviceGetTotalEccErrors(
                    h, getattr(nvml, kind), nvml.NVML_VOLATILE_ECC))
            except Exception:  # noqa: BLE001 - ECC off or not supported
                pass
        try:
            rows = nvml.nvmlDeviceGetRemappedRows(h)  # (corr, unc, pending, failure)
            facts["remap_pending"], facts["remap_failure"] = bool(rows[2]), bool(rows[3])
        except Exception:  # noqa: BLE001 - before Ampere, or not supported
            pass
        out[g.uuid] = facts
    return out


def median_run(runs: list[result_folders.Run], label: str) -> result_folders.Run:
    """A run whose every point is the median of these runs' (time, spread, trial spread)."""
    pts = pd.concat([r.points for r in runs], ignore_index=True)
    pts = pts[pts["status"] == "ok"]
    keys = ["experiment", "point_id"]
    agg = pts.groupby(keys, sort=False).agg(
        variant=("variant", "first"), status=("status", "first"),
        median_s=("median_s", "median"), noise=("noise", "median"),
        n_samples=("n_samples", "min"), method=("method", "first"),
        trial_spread=("trial_spread", "median"), floor_s=("floor_s", "max"),
        blocks=("blocks", "first"), sm_count=("sm_count", "first")).reset_index()
    agg["gpu"] = runs[0].gpu if runs else ""
    return result_folders.Run(label, Path("."), agg["gpu"].iloc[0] if len(agg) else "",
                       agg.reindex(columns=result_folders.POINT_COLS))


def load(folders: dict[int, Path], gpus: dict[int, Gpu]) -> dict[int, result_folders.Run]:
    return {i: result_folders.Run(f"GPU {i}", f, gpus[i].name, result_folders.load_points(f))
            for i, f in folders.items()}


def judge(runs: dict[int, result_folders.Run]) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per GPU, every point's comparison): each GPU against the others' median."""
    rows, frames = [], []
    for i, run in runs.items():
        others = [r for j, r in runs.items() if j != i]
        if not others:
            break
        cmp = compare.compare_pair(median_run(others, "median of the other GPUs"), run)
        cmp["gpu_index"] = i
        frames.append(cmp)
        kern = cmp[cmp["class"].isin(KERNEL_CLASSES)]
        timed = kern[kern["ratio"].notna()]
        slower = timed[timed["verdict"] == "slower"]
        worst = slower.loc[slower["ratio"].idxmax()] if not slower.empty else None
        rows.append({"gpu_index": i, "points": len(timed),
                     "slower": len(slower), "faster": int((timed["verdict"] == "faster").sum()),
                     "median_ratio": float(timed["ratio"].median()) if len(timed) else math.nan,
                     "worst_point": "" if worst is None else
                     f"{worst['experiment']}/{worst['point_id']}",
                     "worst_ratio": math.nan if worst is None else float(worst["ratio"]),
                     "not_ok": int((cmp["status"].fillna("") != "ok").sum())})
    table = pd.DataFrame(rows)
    detail = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return table, detail


def throttled_chunks(folder: Path) -> int:
    """Timed chunks the NVML observer flagged (a clock below its ratio of the maximum, or a
    throttle reason active) in the GPU's jobs."""
    n = 0
    for m in results.read_manifests(folder / "raw", None):
        n += int((m.get("telemetry") or {}).get("nvml_chunks_flagged") or 0)
    return n


def verdicts(table: pd.DataFrame, gpus: dict[int, Gpu], before: dict[str, dict[str, Any]],
             after: dict[str, dict[str, Any]], folders: dict[int, Path]) -> pd.DataFrame:
    """The per-GPU table with its health columns and the verdict: ok or the outlier's causes."""
    out = []
    for r in table.to_dict("records"):
        g = gpus[r["gpu_index"]]
        b, a = before.get(g.uuid, {}), after.get(g.uuid, {})
        why = []
        if r["slower"]:
            why.append(f"{r['slower']} kernel point(s) slower than the other GPUs' median "
                       f"beyond the noise (worst {r['worst_ratio']:.2f}x at {r['worst_point']})")
        thr = throttled_chunks(folders[r["gpu_index"]])
        if thr:
            why.append(f"{thr} timed chunk(s) ran throttled (NVML)")
        for k in ("ecc_corrected", "ecc_uncorrected"):
            if k in a and k in b and a[k] > b[k]:
                why.append(f"{a[k] - b[k]} new {k.replace('_', ' ')} error(s) during the run")
        if a.get("remap_pending") or a.get("remap_failure"):
            why.append("NVML reports memory rows pending remapping (or a remap failure): "
                       "reset the GPU when it is idle, then run acceptance again")
        if r["not_ok"]:
            why.append(f"{r['not_ok']} point(s) not ok (wrong, failed or not measured)")
        out.append({**r, "uuid": g.uuid, "pci_bus_id": g.pci_bus_id, "name": g.name,
                    "throttled_chunks": thr,
                    "ecc_uncorrected": a.get("ecc_uncorrected", ""),
                    "verdict": "outlier" if why else "ok", "why": "; ".join(why)})
    cols = ["gpu_index", "name", "pci_bus_id", "uuid", "verdict", "why", "points", "slower",
            "faster", "median_ratio", "worst_ratio", "worst_point", "throttled_chunks",
            "ecc_uncorrected", "not_ok"]
    return pd.DataFrame(out, columns=cols)


# The course's interconnect numbers (the multi-GPU slides): what this machine is put beside.
COURSE_LINKS = {"NVLink": "NVLink: 300 GB/s", "PCIe": "PCIe: 12-32 GB/s"}


def measure_links(out: Path, say: Any = print) -> pd.DataFrame | None:
    """cudalab.links on every GPU pair (in a process of its own that sees every GPU); None
    where it failed, with its log's end said."""
    log = out / "links.log"
    with open(log, "w") as f:
        r = subprocess.run([sys.executable, "-m", "cudalab.links", "--out",
                            str(out / "links.csv")], stdout=f, stderr=subprocess.STDOUT)
    if not (out / "links.csv").is_file():
        say(f"warning: the links between GPUs were not measured (exit {r.returncode}): "
            + " | ".join(log.read_text(errors="replace").strip().splitlines()[-3:]))
        return None
    return pd.read_csv(out / "links.csv")


def links_matrix_png(links: pd.DataFrame) -> str:
    """The bandwidth matrices of the copies (links.matrix_figure), as a data URI: the page
    stays one file."""
    import base64
    import io

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from cudalab.links import matrix_figure

    size = int(links["bytes"].min()) >> 20 if "bytes" in links and len(links) else 0
    fig = matrix_figure(links, ("peer", "no_peer", "host_staged"),
                        f"Copies between GPUs (GB/s, {size} MiB each)")
    if fig is None:
        return ""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def links_mode_title(mode: str) -> str:
    from cudalab.links import MODE_LABEL

    return MODE_LABEL.get(mode, mode)


def links_lines(links: pd.DataFrame) -> list[str]:
    """Facts about the links: each link type's median per mode, beside the course's number."""
    from cudalab.links import link_label

    out = []
    for link, g in links.groupby("link"):
        med = g.groupby("mode")["gbps"].median()
        kind = "NVLink" if str(link).startswith("NV") else "PCIe"
        parts = [f"{links_mode_title(m)} {med[m]:.0f} GB/s" for m in MODES
                 if m in med.index and pd.notna(med[m])]
        out.append(f"{link_label(str(link))}: " + "; ".join(parts)
                   + f" (the course: {COURSE_LINKS[kind]})")
    return out


def write_page(table: pd.DataFrame, path: Path, host: str, took_s: float,
               links: pd.DataFrame | None = None) -> None:
    """One page a site engineer reads in a minute: the verdict per GPU first."""
    bad = table[table["verdict"] != "ok"]
    slow = slow_pairs(links) if links is not None else pd.DataFrame()
    head = (f"{len(bad)} of {len(table)} GPU(s) are outliers" if len(bad)
            else f"all {len(table)} GPUs agree within the noise")
    if len(slow):
        head += f"; {len(slow)} GPU pair(s) copy slower than the others of their link type"
    rows = "".join(
        f"<tr class='{html.escape(r.verdict)}'><td>{r.gpu_index}</td><td>{html.escape(r.name)}"
        f"</td><td>{html.escape(r.pci_bus_id)}</td><td><b>{html.escape(r.verdict)}</b></td>"
        f"<td>{_num(r.median_ratio)}</td><td>{r.slower}/{r.points}</td>"
        f"<td>{html.escape(r.why) or '&mdash;'}</td></tr>" for r in table.itertuples())
    page = f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>cudalab node acceptance: {html.escape(host)}</title><style>
body{{font:16px/1.4 system-ui,sans-serif;margin:2em;max-width:75em}}
table{{border-collapse:collapse}}td,th{{border:1px solid #bbb;padding:.3em .6em;text-align:left}}
tr.outlier{{background:#fde2e1}}tr.ok{{background:#e6f4ea}}</style></head><body>
<h1>Node acceptance: {html.escape(host)}</h1>
<p><b>{html.escape(head)}.</b> The same grid ran on every GPU at once ({took_s:.0f} s);
each GPU is compared with the median of the other GPUs, point by point, with the verdict
of <code>cudalab compare</code> (slower only beyond max(5 %, 3 × the trials' spread, the
resolution floor)). Host-bound points never flag a GPU.</p>
<table><thead><tr><th>GPU</th><th>model</th><th>PCI bus</th><th>verdict</th>
<th>median time ratio to the others</th><th>slower points</th><th>why</th></tr></thead>
<tbody>{rows}</tbody></table>
{_links_html(links, slow)}
<p>Every point: accept.csv's detail in points.csv; each GPU's run folder: gpu&lt;index&gt;/.</p>
</body></html>"""
    with results.atomic_path(path) as tmp:
        tmp.write_text(page)


def _links_html(links: pd.DataFrame | None, slow: pd.DataFrame) -> str:
    if links is None:
        return "<h2>Links between GPUs</h2><p>Not measured (links.log says why).</p>"
    items = "".join(f"<li>{html.escape(line)}</li>" for line in links_lines(links))
    bad = "".join(f"<li><b>GPU {r.src} &rarr; GPU {r.dst}</b> ({html.escape(str(r.link))}): "
                  f"{r.gbps:.0f} GB/s, {r.share_of_median:.0%} of its link type's median</li>"
                  for r in slow.itertuples())
    wrong = links[~links["correct"].astype(bool) & links["note"].isna()]
    png = links_matrix_png(links)
    img = f"<img alt='bandwidth matrix' style='max-width:100%' src='{png}'>" if png else ""
    return (f"<h2>Links between GPUs</h2>{img}<ul>{items}</ul>"
            + (f"<p>Slow pairs (below {SLOW_SHARE:.0%} of the median of their link type):</p>"
               f"<ul>{bad}</ul>" if bad else "")
            + (f"<p><b>{len(wrong)} copies did not arrive intact</b> (links.csv).</p>"
               if len(wrong) else ""))


def _num(x: float) -> str:
    return "&mdash;" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.3f}"


def run(config_path: str, out: Path, say: Any = print, plant_gpu: int | None = None) -> int:
    """Acceptance of this machine's GPUs; 0: none is an outlier, 1: some are, 2: cannot run."""
    try:
        base = cfg.load(config_path)
    except cfg.ConfigError as exc:
        say(f"error: {exc}")
        return 2
    found = gpu_slots.usable_gpus(base)
    if len(found) < 2:
        say(f"error: node acceptance compares GPUs with each other: {len(found)} usable GPU(s) "
            "here (NVML, CUDA_VISIBLE_DEVICES and the config's gpus: list decide)")
        return 2
    gpus = {g.index: g for g in found}
    folders = {i: out / f"gpu{i}" for i in gpus}
    before = nvml_health(found)
    say(f"cudalab accept: {len(found)} GPUs, the grid {', '.join(GRID)} on each at once")
    t0 = time.time()
    rcs: dict[int, int] = {}
    if plant_gpu is not None:
        say(f"test hook: GPU {plant_gpu}'s kernels are built with {PLANTED} (slower on purpose)")
    threads = [threading.Thread(target=lambda i=i: rcs.__setitem__(i, measure_gpu(
        grid_config(base, gpus[i]), gpus[i], folders[i], out / f"gpu{i}.log",
        PLANTED if i == plant_gpu else ""))) for i in gpus]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    took = time.time() - t0
    for i, rc in sorted(rcs.items()):
        if rc:
            say(f"warning: GPU {i}: a measure job exited {rc} (its log: {out / f'gpu{i}.log'})")
    after = nvml_health(found)
    table, detail = judge(load(folders, gpus))
    table = verdicts(table, gpus, before, after, folders)
    for frame, name in ((table, "accept.csv"), (detail, "points.csv")):
        with results.atomic_path(out / name) as tmp:
            safe_text.write_frame(frame, tmp)
    links = measure_links(out, say)
    write_page(table, out / "accept.html", _host(), took, links)
    for r in table.itertuples():
        say(f"  GPU {r.gpu_index} ({r.pci_bus_id}): {r.verdict}"
            + (f": {r.why}" if r.why else f", median ratio {_num(r.median_ratio)}"))
    say(f"cudalab accept: {out / 'accept.html'} ({took:.0f} s)")
    slow = slow_pairs(links) if links is not None else pd.DataFrame()
    for r in slow.itertuples():
        say(f"  link GPU {r.src} -> GPU {r.dst} ({r.link}): {r.gbps:.0f} GB/s, "
            f"{r.share_of_median:.0%} of its link type's median: slow")
    return 1 if (table["verdict"] != "ok").any() or len(slow) else 0


def _host() -> str:
    import socket

    return socket.gethostname()


def add_parser(sub: Any) -> None:
    s = sub.add_parser("accept", help="node acceptance: the same grid on every GPU at once, "
                       "each judged against the others (accept.html)")
    s.add_argument("--config", default="config.yaml",
                   help="its harness, telemetry and gpus: settings (the grid is cudalab's own)")
    s.add_argument("--out", default="accept", help="folder for the runs, accept.csv and "
                   "accept.html (default: accept)")
    s.add_argument("--plant-slowdown", type=int, default=None, metavar="INDEX",
                   help=f"test hook: build GPU INDEX's kernels with {PLANTED}, so that a "
                   "working acceptance flags it (tools/accept_planted.sh)")
    fleet = s.add_argument_group("every node of a Slurm partition (cudalab/fleet.py)")
    fleet.add_argument("--slurm", action="store_true", help="one job per node of "
                       "--partition, each holding all the node's GPUs; then fleet.html")
    fleet.add_argument("--partition", default="", help="the partition whose nodes to accept")
    fleet.add_argument("--account", default="", help="sbatch --account, where the site wants")
    fleet.add_argument("--time-min", type=int, default=30, help="each job's time limit")
    fleet.add_argument("--no-wait", action="store_true", help="submit and return; "
                       "--collect builds the page later")
    fleet.add_argument("--collect", action="store_true", help="only build fleet.csv and "
                       "fleet.html from --out's node folders")
    s.set_defaults(fn=_command)


def _command(a: Any) -> int:
    if a.slurm or a.collect:
        from cudalab import fleet

        if a.out == "accept":
            a.out = "accept-fleet"
        return fleet.run(a)
    return run(a.config, Path(a.out), plant_gpu=a.plant_slowdown)

