localrules:
    html_report,


# One report: drawn from the first folder (results/, or the first GPU model's), with every
# other model of a sweep set beside it (cudalab.compare reads their folders). Each model's
# table and figures are in its own folder.
rule html_report:
    input:
        table=TABLE,
        tables=[f"{f}/results.csv" for f in FOLDERS[1:]],  # the models set beside it
        figures=all_figures(),
    output:
        report=REPORT,
        # the telemetry figure of each GPU job (job ids are known only at run time)
        telemetry=directory(f"{RESULTS}/figures/_telemetry"),
    params:
        figures=f"{MEASURED}/figures",
        results=MEASURED,  # its telemetry/ is this run's
    log:
        f"{RESULTS}/logs/report.log",
    conda:
        CONDA_ENV
    shell:
        "{CUDALAB} report --config {CONFIG_JSON:q} --table {input.table:q}"
        " --figures {params.figures:q} --results {params.results:q}"
        " --telemetry-figures {output.telemetry:q} --out {output.report:q} > {log:q} 2>&1"
