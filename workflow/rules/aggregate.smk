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
    conda:
        CONDA_ENV
    # --manifests: the table holds this run's experiments only (robust, issue 12 item 7)
    shell:
        "{CUDALAB} aggregate --results {params.results} --out {output}"
        " --manifests {input} > {log} 2>&1"
