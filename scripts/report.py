"""Snakemake script: the self-contained HTML report (rule html_report)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(snakemake.scriptdir).parent))  # noqa: F821 - set by Snakemake

from cudalab import report, results, telemetry_report  # noqa: E402
from cudalab.logs import tee_to  # noqa: E402

with tee_to(snakemake.log[0]):  # noqa: F821
    df = results.read_table(Path(snakemake.input.table))  # noqa: F821
    tele = telemetry_report.sections(Path(snakemake.params.results))  # noqa: F821
    out = report.render(df, Path(snakemake.params.figures), snakemake.config,  # noqa: F821
                        Path(snakemake.output[0]), tele,  # noqa: F821
                        results_dir=Path(snakemake.params.results))  # noqa: F821 (report: raw links)
    print(f"report: {out.resolve()}", file=sys.stderr)
