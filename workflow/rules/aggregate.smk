localrules:
    aggregate,


rule aggregate:
    input:
        measure_manifests(),  # sweep.smk: per experiment, or per (experiment, GPU model)
    output:
        TABLE,
    params:
        results=MEASURED,  # sweep.smk: results/, or the first GPU model's folder
    log:
        f"{RESULTS}/logs/aggregate.log",
    script:
        "../../scripts/aggregate.py"
