"""One self-contained HTML report (figures embedded as data: URIs, no server, no network),
rendered with jinja2 from reports/templates/report.html.j2."""

from __future__ import annotations

import html
import json
import os
from pathlib import Path
from typing import Any

import pandas as pd
from jinja2 import Environment, FileSystemLoader, select_autoescape

from cudalab import (
    claims_file,
    explain,
    fmt,
    handout,
    results,
    roofline,
    roofline_figure,
    run_ceilings,
    run_figures,
    timing_report,
)
from cudalab.compare_report import report_context as compare_context
from cudalab.embed import data_uri
from cudalab.experiments import REGISTRY
from cudalab.experiments.lesson import State
from cudalab.resources import TEMPLATES_DIR as TEMPLATES
from cudalab.run_claims import RunClaims, judge_lessons

# The columns every experiment's results table shows (after its parameters); m_ metric
# columns follow on screen and are left out of print (class "metric"): they are in
# results.csv and in the raw record each row links to.
# memory_level and the % of the measured ceiling of that level stand beside every GB/s
# (aggregate writes them; roofline.load_table derives them for tables older than those).
TABLE_COLS = ["variant", "status", "time_median_s", "spread", "n_samples", "gflops",
              "pct_peak_gflops", "pct_ceil_gflops", "gbps", "memory_level", "pct_peak_gbps",
              "pct_ceil_gbps", "error", "reason"]
HEADERS = {"time_median_s": "median time", "spread": "spread (IQR · CV)",
           "n_samples": "samples", "gflops": "FLOP rate", "pct_peak_gflops": "% FP32 peak",
           "pct_ceil_gflops": "% of its FLOP roof", "gbps": "bandwidth",
           "memory_level": "level", "pct_peak_gbps": "% DRAM peak",
           "pct_ceil_gbps": "% ceiling of level", "raw": "raw record"}
NOT_MEASURED = "not_measured"  # the status of a GPU point where no GPU was found
SUSPECT_MARK = "⚠"  # beside a speed above the ceiling it is compared with
# How a claim's state reads: its mark, and the CSS class that colours it.
STATE_MARK = {State.SEEN.value: "✔ seen", State.NOT_SEEN.value: "✘ not seen",
              State.NOT_MEASURED.value: "– not measured",
              State.NOT_APPLICABLE.value: "– not applicable"}
STATE_CLASS = {State.SEEN.value: "pass", State.NOT_SEEN.value: "fail",
               State.NOT_MEASURED.value: "unknown", State.NOT_APPLICABLE.value: "unknown"}


def _fmt(v: Any) -> str:
    """Provenance and device facts verbatim (a version "9.0" is not the number 9)."""
    return "" if fmt.missing(v) else str(v)


def spread(row: pd.Series) -> str:
    """The samples' spread: interquartile range and coefficient of variation."""
    iqr, cv = row.get("time_iqr_s"), row.get("time_cv")
    if fmt.missing(iqr) and fmt.missing(cv):
        return ""
    return f"{fmt.seconds(iqr)} · {fmt.percent(cv, fraction=True)}"


def raw_link(experiment: str, point_id: str, raw_href: str) -> str:
    """<a> to the point's raw record (every sample), relative to the report."""
    href = f"{raw_href.rstrip('/')}/{experiment}/{point_id}.json"
    return f'<a href="{html.escape(href)}">{html.escape(point_id)}</a>'


def _cell(col: str, row: pd.Series) -> str:
    if col == "spread":
        return html.escape(spread(row))
    if col == "reason":  # long text: a tooltip, the cell stays narrow
        r = "" if fmt.missing(row.get(col)) else str(row[col])
        return f'<span title="{html.escape(r)}">{html.escape(r[:60])}</span>'
    roof_name = row.get("roof_name")
    roof_name = "FP32" if fmt.missing(roof_name) or not roof_name else str(roof_name)
    if col == "pct_peak_gflops" and roof_name != "FP32":
        return ""  # a float64 or tensor-core point: its share of its own roof is beside it
    if col in ("pct_ceil_gbps", "pct_ceil_gflops"):
        text = fmt.percent(row.get(col))
        roof = roof_name if col == "pct_ceil_gflops" else None
        if text and roof and roof != "FP32":  # float64, tensor cores
            text += f" of {roof}"
        return html.escape(text)
    text = html.escape(fmt.cell(col, row.get(col)))
    if col in ("gbps", "gflops") and text and _suspect(row):
        why = html.escape(str(row.get("suspect_why") or "above its ceiling"))
        return f'{text} <span class="suspect-mark" title="{why}">{SUSPECT_MARK}</span>'
    return text


def _suspect(row: pd.Series) -> bool:
    v = row.get("suspect")
    return not fmt.missing(v) and bool(v)


def table_html(df: pd.DataFrame, cols: list[str], max_rows: int, raw_href: str = "raw") -> str:
    """The results table: one row per point, formatted by column kind, the first cell a
    link to the point's raw record; metric columns carry class "metric" (not printed)."""
    cols = [c for c in cols if c == "spread" or (c in df.columns and df[c].notna().any()
                                                  and (df[c].astype(str) != "").any())]
    # not printed: metric columns (in results.csv and the raw record), the link (paper
    # cannot follow it) and the reason (listed in full above the table)
    # (nor the % of a theoretical peak where the % of the measured ceiling is beside it)
    measured = {"pct_peak_gbps": "pct_ceil_gbps", "pct_peak_gflops": "pct_ceil_gflops"}
    cls = {c: ' class="metric"' if c.startswith("m_") or c == "reason"
           or measured.get(c) in cols else "" for c in cols}
    head = '<th class="metric">raw record</th>' + "".join(
        f"<th{cls[c]}>{html.escape(HEADERS.get(c, fmt.header(c)))}</th>" for c in cols)
    body = []
    for _, row in df.head(max_rows).iterrows():
        st = " ".join([f"st-{row['status']}"] * ("status" in row)
                      + ["suspect"] * _suspect(row))
        st = f' class="{st}"' if st else ""
        link = raw_link(str(row["experiment"]), str(row["point_id"]), raw_href)
        tds = "".join(f"<td{cls[c]}>{_cell(c, row)}</td>" for c in cols)
        body.append(f'<tr{st}><td class="metric">{link}</td>{tds}</tr>')
    more = (f'<p class="note">{len(df) - max_rows} more rows in results.csv</p>'
            if len(df) > max_rows else "")
    rows = "".join(body)
    return (f'<table class="data results"><thead><tr>{head}</tr></thead><tbody>{rows}</tbody>'
            f"</table>{more}")


def _param_cols(df: pd.DataFrame) -> list[str]:
    return [c for c in df.columns if c.startswith("p_") and df[c].notna().any()]


# Of the ~20 Nsight Compute columns (profile.ncu), the results tables show these three: the
# rest stay in results.csv (and feed the explanations), so a table still fits a printed page.
NCU_TABLE_COLS = ("m_ncu_achieved_occupancy_pct", "m_ncu_dram_throughput_pct",
                  "m_ncu_l2_hit_rate_pct")


def _metric_cols(df: pd.DataFrame, max_chars: int = 60) -> list[str]:
    """The m_ columns worth a table cell: not empty, and no long text (a stream timeline,
    a note) that would stretch every row; those stay in results.csv."""
    cols = []
    for c in sorted(c for c in df.columns if c.startswith("m_")):
        if c.startswith("m_ncu_") and c not in NCU_TABLE_COLS:
            continue
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


def _figures(name: str, exp: Any, figures_dir: Path) -> list[dict[str, str]]:
    figs = []
    for fig_name, cap in exp.lesson.figures.items():
        png = figures_dir / name / f"{fig_name}.png"
        if png.exists():
            figs.append({"name": fig_name, "caption": cap, "src": data_uri(png)})
    return figs


def main_figure(exp: Any, figures: list[dict[str, str]]) -> dict[str, str] | None:
    """The lesson's first figure on screen: the one its handout prints (Lesson.print_figure,
    cudalab/handout.py), else its first drawn figure."""
    want = (handout.print_choice(exp.name) or ("",))[0]
    named = [f for f in figures if f["name"] == want]
    return (named or figures or [None])[0]


def handout_figure(name: str, figures_dir: Path) -> dict[str, Any] | None:
    """The lesson's figure on paper (cudalab/handout.py), set at the width it was drawn for
    so its labels print at the size they were drawn at; None where the figures step drew
    none."""
    png = figures_dir / name / f"{handout.FILE}.png"
    if not png.exists():
        return None
    width = handout.printed_width_mm(handout.png_info(png.read_bytes()))
    return {"src": data_uri(png), "width_mm": width,
            "beside": width is not None and width <= handout.BESIDE_TEXT_MM}


def _roofline_figure(rooflines: dict[str, dict[str, str]], name: str) -> dict[str, str] | None:
    return rooflines.get(name)


def _section(name: str, exp: Any, sub: pd.DataFrame, figures_dir: Path, max_rows: int,
             raw_href: str, df: pd.DataFrame, rooflines: dict[str, dict[str, str]],
             judged: RunClaims | None = None) -> dict[str, Any]:
    """One experiment's part of the report (df: the whole table, whose ceilings and L2 size
    the explanations read; judged: the run's claims.json, else this lesson judged by
    run_claims.judge_lessons)."""
    if judged is None:
        judged = RunClaims({"lessons": judge_lessons(df, [name])})
    # a point the run could not measure (no GPU) is not measured, never "not ok"
    not_ok = sub[~sub["status"].isin(["ok", NOT_MEASURED])]
    cols = _param_cols(sub) + TABLE_COLS + _metric_cols(sub)
    summary = exp.summary_table(sub)
    claims = judged.claims(name)
    figs = _figures(name, exp, figures_dir)
    return {
        "name": name, "title": exp.lesson.title, "caption": exp.lesson.caption,
        "figures": figs, "main_figure": main_figure(exp, figs),
        "print_figure": handout_figure(name, figures_dir),
        # every claim of the lesson in one of four states; a claim not seen is a place
        # where this GPU contradicts the lesson, flagged with its evidence
        "claims": claims,
        "contradictions": [c for c in claims if c.state is State.NOT_SEEN],
        "tables": exp.tables(sub),
        "try_this": exp.lesson.try_this,
        "try_claims": judged.try_this(name),
        "questions": [q.text for q in exp.lesson.questions],  # the student edition: no answers
        "counts": sub["status"].value_counts().to_dict(),
        "failures": not_ok[["point_id", "status", "reason"]].to_dict("records"),
        "not_measured": not_measured_reasons(sub),
        # device_query's one row of ~50 facts reads as a key/value list, not a table
        "summary": summary,
        "table": "" if summary else table_html(sub.drop(columns=["params"]), cols, max_rows,
                                               raw_href),
        "throttle_note": throttle_note(sub),
        # facts computed from this run's data, where GB/s came from
        "explanations": explain.explain(name, df),
        "memory_note": roofline.hot_cold_note(sub, run_ceilings.ceilings_of(df)),
        "distrust": roofline.distrust(sub),
        "roofline": _roofline_figure(rooflines, name),
    }


def _why_not_measured(reason: Any) -> str:
    """A not-measured point's reason without its 'not measured: ' prefix."""
    text = "" if fmt.missing(reason) else str(reason)
    return text.removeprefix("not measured: ").strip() or "no reason recorded"


def not_measured_reasons(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The points the run did not measure, grouped by reason (most points first)."""
    nm = df[df["status"] == NOT_MEASURED]
    if nm.empty:
        return []
    why = nm["reason"].map(_why_not_measured)
    return [{"reason": r, "n": int(n), "points": list(nm.loc[why == r, "point_id"].astype(str))}
            for r, n in why.value_counts().items()]


def measured_on_gpu(df: pd.DataFrame) -> bool:
    """Whether any point of the table was measured on a GPU (a GPU's name recorded)."""
    if "gpu_name" not in df:
        return False
    name = df["gpu_name"]
    return bool((name.notna() & (name.astype(str).str.strip() != "")).any())


def gpu_banner(df: pd.DataFrame) -> dict[str, Any] | None:
    """What the top of the report says where points were not measured: none if every
    point was; no_gpu: the run measured no GPU point at all (a machine without one)."""
    reasons = not_measured_reasons(df)
    if not reasons:
        return None
    return {"no_gpu": not measured_on_gpu(df), "n": sum(r["n"] for r in reasons),
            "n_points": len(df), "reasons": [r | {"points": []} for r in reasons[:3]],
            "experiments": sorted(set(df.loc[df["status"] == NOT_MEASURED, "experiment"])),
            "measured": sorted(set(df.loc[df["status"] == "ok", "experiment"]))}


def provenance_summary(prov: pd.DataFrame, show: int = 3) -> dict[str, str]:
    """Each provenance column once: its value, or its distinct values (the first few and a
    count) where rows differ, e.g. the timestamp of every point."""
    out = {}
    for col in prov.columns:
        vals = [str(v) for v in prov[col].dropna().unique() if str(v) != ""]
        if not vals:
            continue
        if len(vals) > show:
            vals = sorted(vals)
            out[col] = f"{len(vals)} distinct values: {vals[0]} … {vals[-1]}"
        else:
            out[col] = " | ".join(vals)
    return out


def gpus_used(df: pd.DataFrame) -> list[dict[str, Any]]:
    """The GPUs this run measured on, each with the experiments (jobs) it ran: a local run
    on a machine of several GPUs spreads its jobs over them."""
    if "gpu_uuid" not in df or "timer" not in df:
        return []
    gpu = df[df["gpu_uuid"].notna() & (df["gpu_uuid"].astype(str) != "")
             & (df["timer"] != "perf_counter")]  # CPU points carry their job's GPU too
    out = []
    for uuid, g in gpu.groupby("gpu_uuid", sort=False):
        idx = g["gpu_smi_index"].dropna() if "gpu_smi_index" in g else pd.Series([], dtype=int)
        out.append({"index": "" if idx.empty else int(idx.iloc[0]),
                    "name": str(g["gpu_name"].iloc[0]), "uuid": str(uuid),
                    "pci": str(g["gpu_pci_bus_id"].dropna().iloc[0])
                    if "gpu_pci_bus_id" in g and g["gpu_pci_bus_id"].notna().any() else "",
                    "experiments": ", ".join(sorted(g["experiment"].unique())),
                    "points": len(g)})
    return sorted(out, key=lambda r: (r["index"] == "", r["index"], r["uuid"]))


def roofline_context(df: pd.DataFrame, rooflines: dict[str, dict[str, str]]
                     ) -> dict[str, Any]:
    """The report's roofline section: the run's figure, the ceilings measured beside the
    theoretical ones, and every measurement to distrust with why."""
    c = run_ceilings.ceilings_of(df)
    return {"figure": _roofline_figure(rooflines, roofline_figure.RUN_FIGURE),
            "ceilings": run_ceilings.ceilings_rows(c), "measured": c.measured,
            "no_gpu": not measured_on_gpu(df),  # nothing to set against a ceiling
            "distrust": roofline.distrust(df)}


def build_context(df: pd.DataFrame, figures_dir: Path, config: dict[str, Any],
                  telemetry: list[dict[str, Any]] | None = None, raw_href: str = "raw",
                  telemetry_summary: dict[str, Any] | None = None,
                  rooflines: dict[str, dict[str, str]] | None = None,
                  judged: RunClaims | None = None) -> dict[str, Any]:
    """The template's context. df: the table with its derived columns (roofline.load_table);
    telemetry, telemetry_summary, rooflines: the figures step's (run_figures.read), none if
    not given; judged: the run's claims.json (claims_file.for_table; a table in memory
    without one is judged by claims_file.judge_run, the one place claims are judged)."""
    max_rows = config["report"]["max_table_rows"]
    rooflines = rooflines or {}
    judged = judged if judged is not None else claims_file.judge_run(df)
    sections = [_section(name, exp, df[df["experiment"] == name], figures_dir, max_rows,
                         raw_href, df, rooflines, judged)
                for name, exp in REGISTRY.items() if (df["experiment"] == name).any()]
    prov_cols = [c for c in results.PROVENANCE_KEYS if c in df.columns]
    gpu_rows = df[df["gpu_name"].notna()] if "gpu_name" in df else df[:0]
    device = gpu_rows.iloc[0][prov_cols].to_dict() if not gpu_rows.empty else {}
    return {
        "title": config["report"]["title"],
        "run_name": config["run_name"],
        "gpu_banner": gpu_banner(df),
        "generated": pd.Timestamp.now(tz="UTC").isoformat(timespec="seconds"),
        "device": {k: _fmt(v) for k, v in device.items()},
        "sections": sections,
        "claim_counts": {st.value: sum(c.state is st for s in sections for c in s["claims"])
                         for st in State},
        "state_mark": STATE_MARK, "state_class": STATE_CLASS,
        "counts": df["status"].value_counts().to_dict(),
        "n_points": len(df),
        "provenance": provenance_summary(df[prov_cols]),
        "gpus_used": gpus_used(df),
        "telemetry": telemetry or [],
        "telemetry_summary": telemetry_summary or {},
        # convergence and launch overhead (cudalab/timing_report.py)
        "timing": timing_report.context(df, config["measurement"]["target_cv"]),
        "roofline": roofline_context(df, rooflines),
        "config_json": json.dumps(config, indent=1, sort_keys=True),
    }


def render(df: pd.DataFrame, figures_dir: Path, config: dict[str, Any], out: Path,
           results_dir: Path | None = None,
           judged: RunClaims | None = None) -> Path:
    """Write the report to `out`: df is the table with its derived columns (roofline.
    load_table), figures_dir the figures step's folder (each lesson's figures, the rooflines
    and the telemetry; the report draws none), judged the run's claims.json (claims_file;
    judges none). With results_dir, rows link to its raw records (relative to the report)."""
    env = Environment(loader=FileSystemLoader(TEMPLATES),
                      autoescape=select_autoescape(["html", "j2"]))
    env.filters["fmt"] = fmt.short
    raw_href = ("raw" if results_dir is None else
                Path(os.path.relpath(Path(results_dir) / "raw", out.parent)).as_posix())
    drawn = run_figures.read(figures_dir)
    judged = judged if judged is not None else claims_file.judge_run(df)
    ctx = build_context(df, figures_dir, config, drawn["telemetry"], raw_href,
                        drawn["telemetry_summary"], drawn["rooflines"], judged)
    # course table (as claims.json holds it) + baselines: the comparison table and its
    # figures as the figures step wrote them (run_figures.draw_comparisons), rendered here
    # (compare_report.report_context)
    ctx.update(compare_context(df, config, run_figures.comparison_table(figures_dir, config),
                               drawn["comparisons"], course_rows=judged.course))
    for s in ctx["sections"]:  # each lesson's handout page shows its course numbers
        s["course_rows"] = [r for r in ctx["course_rows"] if r["experiment"] == s["name"]]
    page = env.get_template("report.html.j2").render(**ctx)
    with results.atomic_path(out) as tmp:
        tmp.write_text(page)
    return out
