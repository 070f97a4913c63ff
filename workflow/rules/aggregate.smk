localrules:
    aggregate,


rule aggregate:
    input:
        expand(f"{RESULTS}/raw/{{experiment}}/_manifest.json", experiment=EXPERIMENTS),
    output:
        TABLE,
    params:
        results=RESULTS,
    log:
        f"{RESULTS}/logs/aggregate.log",
    conda:
        CONDA_ENV
    shell:
        "{CUDALAB} aggregate --results {params.results} --out {output} > {log} 2>&1"
