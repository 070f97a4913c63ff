"""One self-contained HTML report (figures embedded as data: URIs, no server, no network),
rendered with jinja2 from reports/templates/report.html.j2."""

from __future__ import annotations

import base64
import html
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd
from jinja2 import Environment, FileSystemLoader, select_autoescape

from cudalab import results, timing_report
from cudalab.compare import report_context as compare_context
from cudalab.experiments import REGISTRY

ROOT = Path(__file__).resolve().parent.parent
TEMPLATES = ROOT / "reports" / "templates"

TABLE_COLS = ["variant", "status", "time_median_s", "time_cv", "n_samples", "gflops",
              "pct_peak_gflops", "gbps", "pct_peak_gbps", "error", "reason"]


def data_uri(path: Path) -> str:
    mime = {"png": "image/png", "svg": "image/svg+xml"}[path.suffix[1:]]
    return f"data:{mime};base64," + base64.b64encode(path.read_bytes()).decode()


def _fmt(v: Any) -> str:
    if v is None or (isinstance(v, float) and pd.isna(v)) or v is pd.NA:
        return ""
    if isinstance(v, float):
        if v == 0:
            return "0"
        return f"{v:.3g}" if abs(v) < 1e5 else f"{v:.4g}"
    return str(v)


def table_html(df: pd.DataFrame, cols: list[str], max_rows: int) -> str:
    cols = [c for c in cols if c in df.columns]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in cols)
    body = []
    for _, row in df.head(max_rows).iterrows():
        cls = f' class="st-{row["status"]}"' if "status" in row else ""
        tds = "".join(f"<td>{html.escape(_fmt(row[c]))}</td>" for c in cols)
        body.append(f"<tr{cls}>{tds}</tr>")
    more = (f'<p class="note">{len(df) - max_rows} more rows in results.csv</p>'
            if len(df) > max_rows else "")
    rows = "".join(body)
    return f'<table class="data"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody></table>{more}'


def _param_cols(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c.startswith("p_") and df[c].notna().any()]


def _metric_cols(df: pd.DataFrame, max_chars: int = 60) -> list[str]:
    """The m_ columns worth a table cell: not empty, and no long text (a stream timeline,
    a note) that would stretch every row; those stay in results.csv."""
    cols = []
    for c in sorted(c for c in df.columns if c.startswith("m_")):
        v = df[c].dropna()
        if v.empty or v.map(lambda x: isinstance(x, str) and len(x) > max_chars).any():
            continue
        cols.append(c)
    return cols


def throttle_note(df: pd.DataFrame) -> str:
    """How many timed samples were checked for throttling, and how many were throttled.
    n_throttled is empty where nothing watched the clocks (CPU points, NVML unavailable):
    those samples are 'not checked', never counted as unthrottled."""
    n = df["n_samples"].fillna(0)
    checked = df["n_throttled"].notna()
    total, n_checked = int(n.sum()), int(n[checked].sum())
    if total == 0:
        return "no timed samples"
    note = f"{total} timed samples"
    if n_checked:
        note += (f"; {n_checked} checked for throttling (NVML), "
                 f"{int(df.loc[checked, 'n_throttled'].sum())} taken while throttled")
    if total - n_checked:
        note += f"; {total - n_checked} not checked (CPU points, or NVML unavailable)"
    return note


def build_context(df: pd.DataFrame, figures_dir: Path, config: dict[str, Any],
                  telemetry: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    sections = []
    max_rows = config["report"]["max_table_rows"]
    for name, exp in REGISTRY.items():
        sub = df[df["experiment"] == name]
        if sub.empty:
            continue
        figs = []
        for fig_name, cap in exp.figures.items():
            png = figures_dir / name / f"{fig_name}.png"
            if png.exists():
                figs.append({"name": fig_name, "caption": cap, "src": data_uri(png)})
        not_ok = sub[sub["status"] != "ok"]
        cols = _param_cols(sub) + TABLE_COLS + _metric_cols(sub)
        sections.append({
            "name": name, "title": exp.title, "caption": exp.caption, "figures": figs,
            "expectations": exp.expectations(sub),
            "counts": sub["status"].value_counts().to_dict(),
            "failures": not_ok[["point_id", "status", "reason"]].to_dict("records"),
            "table": table_html(sub.drop(columns=["params"]), cols, max_rows),
            "throttle_note": throttle_note(sub),
        })
    prov_cols = [c for c in results.PROVENANCE_KEYS if c in df.columns]
    gpu_rows = df[df["gpu_name"].notna()] if "gpu_name" in df else df[:0]
    device = gpu_rows.iloc[0][prov_cols].to_dict() if not gpu_rows.empty else {}
    provenance = (
        df[prov_cols].astype("string").drop_duplicates().to_dict("records") if len(df) else []
    )
    counts = df["status"].value_counts().to_dict()
    return {
        "title": config["report"]["title"],
        "run_name": config["run_name"],
        "generated": pd.Timestamp.now(tz="UTC").isoformat(timespec="seconds"),
        "device": {k: _fmt(v) for k, v in device.items()},
        "sections": sections,
        "counts": counts,
        "n_points": len(df),
        "provenance": provenance,
        "telemetry": telemetry or [],
        # issue 8: convergence and launch overhead (cudalab/timing_report.py)
        "timing": timing_report.context(df, config["measurement"]["target_cv"]),
        "config_json": json.dumps(config, indent=1, sort_keys=True),
    }


def render(df: pd.DataFrame, figures_dir: Path, config: dict[str, Any], out: Path,
           telemetry: list[dict[str, Any]] | None = None) -> Path:
    env = Environment(loader=FileSystemLoader(TEMPLATES),
                      autoescape=select_autoescape(["html", "j2"]))
    env.filters["fmt"] = _fmt
    ctx = build_context(df, figures_dir, config, telemetry)
    ctx.update(compare_context(df, config))  # issue 9: course table + baselines (compare.py)
    page = env.get_template("report.html.j2").render(**ctx)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(page)
    os.replace(tmp, out)
    return out
