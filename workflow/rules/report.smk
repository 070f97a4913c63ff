localrules:
    html_report,


rule html_report:
    input:
        table=TABLE,
        figures=[
            f"{RESULTS}/figures/{e}/{f}.png" for e in EXPERIMENTS for f in REGISTRY[e].figures
        ],
    output:
        report=REPORT,
        # the telemetry figure of each GPU job (job ids are known only at run time)
        telemetry=directory(f"{RESULTS}/figures/_telemetry"),
    params:
        figures=f"{RESULTS}/figures",
        results=MEASURED,  # sweep.smk: its telemetry/ is this run's
    log:
        f"{RESULTS}/logs/report.log",
    conda:
        CONDA_ENV
    shell:
        "{CUDALAB} report --config {CONFIG_JSON:q} --table {input.table:q}"
        " --figures {params.figures:q} --results {params.results:q}"
        " --telemetry-figures {output.telemetry:q} --out {output.report:q} > {log:q} 2>&1"
