localrules:
    html_report,


rule html_report:
    input:
        table=TABLE,
        figures=[
            f"{RESULTS}/figures/{e}/{f}.png" for e in EXPERIMENTS for f in REGISTRY[e].figures
        ],
    output:
        REPORT,
    params:
        figures=f"{RESULTS}/figures",
        results=MEASURED,  # sweep.smk: its telemetry/ is this run's
    log:
        f"{RESULTS}/logs/report.log",
    script:
        "../../scripts/report.py"
