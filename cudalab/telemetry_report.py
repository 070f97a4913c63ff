"""Telemetry figures: per GPU job, SM clock, power, temperature and utilisation over time
(nvidia-smi samples) with the measured grid points shaded on the same unix clock, and a line
saying what was unavailable and why. The figures step draws them (cudalab.run_figures); the
report shows them.

Each job's manifest (results/raw/<experiment>/_manifest.json) gives the phases (grid points
with t_start/t_end, unix time), the telemetry status and nvidia-smi's UTC offset; the samples
are in results/telemetry/<job_id>/nvidia_smi.csv.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from cudalab.results import jobs_of
from cudalab.telemetry import parse_nvidia_smi_csv, throttling_samples

# A job shorter than this many samples (device_query) gets no figure of its own: its
# axes would be empty; the run's summary figure still shows it.
MIN_FIGURE_SAMPLES = 3


def load_jobs(results_dir: Path) -> list[dict[str, Any]]:
    jobs = []
    for m in sorted(Path(results_dir).glob("raw/*/_manifest.json")):
        try:
            manifest = json.loads(m.read_text())
        except (OSError, json.JSONDecodeError):
            continue
        jobs.extend(jobs_of(manifest))  # a lesson measured in shards: each shard's job
    return jobs


def job_label(manifest: dict[str, Any]) -> str:
    """The job's name in a legend: its experiment, and its shard where the lesson was split."""
    shard = manifest.get("shard")
    return f"{manifest['experiment']} {shard}" if shard else str(manifest["experiment"])


def telemetry_dir(results_dir: Path, manifest: dict[str, Any]) -> Path:
    """The job's telemetry folder; results/telemetry/<job_id> if the recorded absolute path
    does not exist here (results copied from a cluster or another machine)."""
    recorded = Path(manifest.get("telemetry_dir") or "")
    if str(recorded) not in ("", ".") and recorded.is_dir():
        return recorded
    return Path(results_dir) / "telemetry" / manifest["job_id"]


def load_samples(smi_csv: Path, manifest: dict[str, Any]) -> pd.DataFrame:
    tel = manifest.get("telemetry") or {}
    off = tel.get("nvidia_smi_utc_offset_s")
    df = parse_nvidia_smi_csv(smi_csv.read_text(errors="replace"),
                              utc_offset_s=None if off is None else float(off))
    ratio = tel.get("nvml_throttle_ratio") or 0.85
    df["throttling"] = throttling_samples(df, ratio)
    return df


def _in_phases(t: pd.Series, phases: list[dict[str, Any]]) -> pd.Series:
    inside = pd.Series(False, index=t.index)
    for ph in phases:
        inside |= (t >= ph["t_start"]) & (t <= ph["t_end"])
    return inside


def summarize_job(df: pd.DataFrame, manifest: dict[str, Any]) -> dict[str, Any]:
    """Numbers for the caption: samples, clocks, power, temperature while points were measured."""
    phases = manifest.get("phases", [])
    t = df["t"] if "t" in df else pd.Series(dtype=float)
    inside = _in_phases(t, phases) if len(df) else pd.Series(dtype=bool)
    d = df[inside] if len(df) else df

    def stat(col: str, fn: str) -> float:
        if col not in d or d[col].notna().sum() == 0:
            return math.nan
        return float(getattr(d[col], fn)())

    return {
        "n_samples": int(len(df)),
        "n_in_points": int(inside.sum()) if len(df) else 0,
        "n_throttling_in_points": int(d["throttling"].sum()) if "throttling" in d else 0,
        "sm_clock_median_mhz": stat("clocks.sm", "median"),
        "sm_clock_min_mhz": stat("clocks.sm", "min"),
        "max_sm_clock_mhz": stat("clocks.max.sm", "max"),
        "power_max_w": stat(_power_col(df), "max") if _power_col(df) else math.nan,
        "temperature_max_c": stat("temperature.gpu", "max"),
        "n_points": len(phases),
        "n_points_throttled": sum(1 for p in phases if p.get("n_throttled")),
    }


def _power_col(df: pd.DataFrame) -> str:
    for c in ("power.draw.instant", "power.draw"):
        if c in df and df[c].notna().any():
            return c
    return ""


def plot_job(smi_csv: Path, manifest: dict[str, Any], df: pd.DataFrame | None = None):
    import matplotlib.pyplot as plt

    if df is None:
        df = load_samples(smi_csv, manifest)
    if df.empty or df["t"].isna().all():
        return None
    t0 = manifest["t_start"]
    x = df["t"] - t0
    power = _power_col(df)
    panels = [
        ("clocks.sm", "SM clock (MHz)"),
        (power, "instant power (W)" if power == "power.draw.instant" else "power (W)"),
        ("temperature.gpu", "temperature (°C)"),
        ("utilization.gpu", "GPU busy (%)"),
    ]
    panels = [(c, lab) for c, lab in panels if c and c in df and df[c].notna().any()]
    if not panels:
        return None
    fig, axes = plt.subplots(len(panels), 1, figsize=(10, 1.7 * len(panels) + 0.9),
                             sharex=True, squeeze=False)
    phases = manifest.get("phases", [])
    ratio = (manifest.get("telemetry") or {}).get("nvml_throttle_ratio") or 0.85
    for ax, (col, lab) in zip(axes[:, 0], panels):
        ax.plot(x, df[col], lw=1.1, color="C0", label="GPU" if col == "temperature.gpu" else None)
        ax.set_ylabel(lab, fontsize=9)
        for i, ph in enumerate(phases):
            hot = bool(ph.get("n_throttled"))
            ax.axvspan(ph["t_start"] - t0, ph["t_end"] - t0, lw=0,
                       color="C3" if hot else ("C1" if i % 2 else "C2"),
                       alpha=0.25 if hot else 0.12)
        if col == "clocks.sm":
            if "clocks.max.sm" in df and df["clocks.max.sm"].notna().any():
                top = float(df["clocks.max.sm"].max())
                ax.axhline(top, ls="--", lw=0.8, color="0.4", label="max SM clock")
                ax.axhline(ratio * top, ls=":", lw=0.8, color="C3",
                           label=f"{ratio:g} x max (throttle threshold)")
            hot = df["throttling"] if "throttling" in df else pd.Series(False, index=df.index)
            if hot.any():
                ax.plot(x[hot], df[col][hot], "v", ms=3, color="C3",
                        label="sample with a throttle reason / low clock")
            ax.legend(fontsize=7, loc="lower right")
        if col == "power.draw" or col == "power.draw.instant":
            if "enforced.power.limit" in df and df["enforced.power.limit"].notna().any():
                ax.axhline(float(df["enforced.power.limit"].max()), ls="--", lw=0.8,
                           color="0.4", label="power limit")
                ax.legend(fontsize=7, loc="lower right")
        if col == "temperature.gpu" and "temperature.memory" in df \
                and df["temperature.memory"].notna().any():
            ax.plot(x, df["temperature.memory"], lw=0.9, color="C4", label="memory (HBM)")
            ax.legend(fontsize=7, loc="lower right")
    axes[-1, 0].set_xlabel("time since the job started (s, unix clock shared with the points)")
    fig.suptitle(f"{manifest['job_id']}: GPU telemetry (shaded: grid points being measured, "
                 "red: points with throttled samples)", fontsize=10)
    fig.tight_layout()
    return fig


def status_text(manifest: dict[str, Any]) -> str:
    """What telemetry this job lacks, and why ('' if everything worked)."""
    tel = manifest.get("telemetry") or {}
    parts = []
    if tel.get("nvidia_smi", "unavailable") != "ok":
        parts.append("nvidia-smi telemetry unavailable: "
                     + (tel.get("nvidia_smi_reason") or tel.get("reason") or "no reason recorded"))
    if tel.get("nvml", "unavailable") != "ok":
        parts.append("NVML unavailable, so throttled samples could not be flagged "
                     "(n_throttled is empty): "
                     + (tel.get("nvml_reason") or tel.get("reason") or "no reason recorded"))
    parts += [f"warning: {w}" for w in tel.get("nvidia_smi_warnings") or []]
    return " · ".join(parts)


def caption_text(manifest: dict[str, Any], s: dict[str, Any]) -> str:
    def f(v: float, unit: str) -> str:
        return "n/a" if v is None or (isinstance(v, float) and math.isnan(v)) \
            else f"{v:.0f} {unit}"

    return (
        f"{manifest['experiment']}: {s['n_samples']} nvidia-smi samples, {s['n_in_points']} "
        f"while {s['n_points']} points were measured; SM clock median "
        f"{f(s['sm_clock_median_mhz'], 'MHz')} (min {f(s['sm_clock_min_mhz'], 'MHz')}, max "
        f"{f(s['max_sm_clock_mhz'], 'MHz')}), peak power {f(s['power_max_w'], 'W')}, peak "
        f"temperature {f(s['temperature_max_c'], '°C')}; {s['n_throttling_in_points']} samples "
        f"during points with a throttle reason or a low clock; {s['n_points_throttled']} "
        "points with samples flagged by NVML."
    )


def sections(results_dir: Path, fig_dir: Path) -> list[dict[str, Any]]:
    """One entry per GPU job: its figure (png: the file, fig_dir/<job_id>.png|svg; '' where
    none was drawn), caption, and what was unavailable."""
    return [job_section(results_dir, fig_dir, m) for m in gpu_jobs(results_dir)]


def gpu_jobs(results_dir: Path) -> list[dict[str, Any]]:
    """The manifests of the jobs that sampled a GPU (a CPU-only job expects no telemetry)."""
    return [m for m in load_jobs(results_dir) if m.get("telemetry_dir")]


def job_section(results_dir: Path, fig_dir: Path, m: dict[str, Any]) -> dict[str, Any]:
    """One GPU job's entry of sections(), its figure drawn (a task of its own: the figures
    step draws the jobs' figures side by side)."""
    from cudalab.figures import save, setup_style

    setup_style()
    tdir = telemetry_dir(results_dir, m)
    entry = {"job_id": m["job_id"], "status": status_text(m), "png": "", "caption": ""}
    smi = tdir / "nvidia_smi.csv"
    if smi.exists():
        df = load_samples(smi, m)
        fig = plot_job(smi, m, df) if len(df) >= MIN_FIGURE_SAMPLES else None
        if fig is not None:
            entry["png"] = str(save(fig, Path(fig_dir) / m["job_id"])[0])
            entry["caption"] = caption_text(m, summarize_job(df, m))
        elif not entry["status"]:
            entry["status"] = (f"only {len(df)} nvidia-smi samples: too few for a figure"
                               if len(df) else
                               "nvidia-smi wrote no usable samples for this job.")
    elif (m.get("telemetry") or {}).get("nvidia_smi") == "ok":
        entry["status"] = (entry["status"] + " " if entry["status"] else "") + \
            f"nvidia-smi samples missing ({smi} not found)."
    return entry


# -- one summary figure for the whole run ---------------------------------------------------
def _run_samples(results_dir: Path) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Every GPU job's nvidia-smi samples in one frame (column 'job'), and the jobs."""
    frames, jobs = [], []
    for m in gpu_jobs(results_dir):
        smi = telemetry_dir(results_dir, m) / "nvidia_smi.csv"
        if not smi.exists():
            continue
        df = load_samples(smi, m)
        if df.empty or df["t"].isna().all():
            continue
        frames.append(df.assign(job=job_label(m)))
        jobs.append(m)
    return (pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()), jobs


def plot_run(df: pd.DataFrame, jobs: list[dict[str, Any]]):
    """SM clock, power and temperature of the whole run on one time axis, each job's span
    shaded in its own colour (legend below: no labels inside the plot to collide)."""
    import matplotlib.pyplot as plt
    import seaborn as sns

    t0 = min(m["t_start"] for m in jobs)
    x = df["t"] - t0
    power = _power_col(df)
    panels = [(c, lab) for c, lab in (("clocks.sm", "SM clock (MHz)"), (power, "power (W)"),
                                      ("temperature.gpu", "GPU temp. (°C)"))
              if c and c in df and df[c].notna().any()]
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 1.6 * len(panels) + 1.6),
                             sharex=True, squeeze=False)
    jobs = sorted(jobs, key=lambda m: m["t_start"])  # legend in the order they ran
    pal = sns.color_palette("tab20", 20)
    colors = [pal[i % 20] for i in list(range(0, 20, 2)) + list(range(1, 20, 2))]
    for ax, (col, lab) in zip(axes[:, 0], panels):
        for m, c in zip(jobs, colors):
            ax.axvspan(m["t_start"] - t0, m["t_end"] - t0, color=c, alpha=0.35, lw=0,
                       label=job_label(m))
        ax.plot(x, df[col], ".", ms=2, color="0.15")
        ax.set_ylabel(lab, fontsize=9)
        if col == "clocks.sm" and "clocks.max.sm" in df and df["clocks.max.sm"].notna().any():
            ax.axhline(float(df["clocks.max.sm"].max()), ls="--", lw=0.8, color="C3")
        hot = df["throttling"] if "throttling" in df else pd.Series(False, index=df.index)
        if col == "clocks.sm" and hot.any():
            ax.plot(x[hot], df[col][hot], "v", ms=4, color="C3")
    axes[-1, 0].set_xlabel("time since the first GPU job started (s)")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(6, len(jobs)), fontsize=8,
               frameon=False, title="GPU job (shaded while it ran)", title_fontsize=8)
    fig.suptitle("GPU telemetry of the whole run (nvidia-smi samples; dashed: max SM clock; "
                 "red triangles: throttled)", fontsize=10)
    rows = -(-len(jobs) // min(6, len(jobs)))
    fig.tight_layout(rect=(0, 0.02 + 0.05 * rows, 1, 1))
    return fig


def run_caption(df: pd.DataFrame, jobs: list[dict[str, Any]]) -> str:
    from cudalab import fmt

    power = _power_col(df)
    clock = df["clocks.sm"].dropna() if "clocks.sm" in df else pd.Series(dtype=float)
    parts = [f"{fmt.integer(len(df))} nvidia-smi samples over {len(jobs)} GPU jobs"]
    if len(clock):
        parts.append(f"SM clock {fmt.integer(clock.min())}–{fmt.integer(clock.max())} MHz "
                     f"(median {fmt.integer(clock.median())})")
    if power:
        parts.append(f"{'instant ' if power.endswith('instant') else ''}power "
                     f"{fmt.integer(round(df[power].min()))}–"
                     f"{fmt.integer(round(df[power].max()))} W")
    if "temperature.gpu" in df and df["temperature.gpu"].notna().any():
        parts.append(f"GPU {fmt.integer(df['temperature.gpu'].min())}–"
                     f"{fmt.integer(df['temperature.gpu'].max())} °C")
    n_hot = int(df["throttling"].sum()) if "throttling" in df else 0
    parts.append(f"{n_hot} samples with a throttle reason or a low clock")
    return "; ".join(parts) + "."


def run_summary(results_dir: Path, fig_dir: Path) -> dict[str, Any]:
    """The run's one telemetry figure (png: fig_dir/run_summary.png|svg) and caption; {}
    without samples."""
    from cudalab.figures import save, setup_style

    df, jobs = _run_samples(Path(results_dir))
    if df.empty:
        return {}
    setup_style()
    png = save(plot_run(df, jobs), Path(fig_dir) / "run_summary")[0]
    return {"png": str(png), "caption": run_caption(df, jobs)}
