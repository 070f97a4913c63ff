localrules:
    html_report,


# One report: drawn from the first folder (results/, or the first GPU model's), with every
# other model of a sweep set beside it (cudalab.compare reads their folders). Each model's
# table and figures are in its own folder.
rule html_report:
    input:
        table=TABLE,
        claims=CLAIMS,  # the run's claims, judged once by aggregate
        tables=[f"{f}/results.csv" for f in FOLDERS[1:]],  # the models set beside it
        figures=all_figures(),
        run_figures=run_figure_dirs(),  # the rooflines and the telemetry (figures.smk)
        compare_figures=f"{MEASURED}/figures/_compare",  # ratios to the baselines
    output:
        report=REPORT,
    params:
        figures=f"{MEASURED}/figures",
        results=MEASURED,  # its raw records are the ones the table's rows link to
    log:
        f"{RESULTS}/logs/report.log",
    conda:
        CONDA_ENV
    shell:
        "{CUDALAB} report --config {CONFIG_JSON:q} --table {input.table:q}"
        " --figures {params.figures:q} --results {params.results:q}"
        " --claims {input.claims:q} --out {output.report:q} > {log:q} 2>&1"
