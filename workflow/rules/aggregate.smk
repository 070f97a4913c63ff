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
    # --manifests: the table holds this run's experiments only, not the leftovers of an
    # experiment an earlier run had enabled
    shell:
        "{CUDALAB} aggregate --results {params.results:q} --out {output:q}"
        " --manifests {input:q} > {log:q} 2>&1"
