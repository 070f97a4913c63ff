localrules:
    aggregate,


rule aggregate:
    input:
        # this folder's measure jobs (results/, or one GPU model's folder in a sweep)
        lambda w: [f"{w.folder}/raw/{e}/_manifest.json" for e in EXPERIMENTS],
    output:
        table="{folder}/results.csv",
        # every claim of the run judged once (cudalab/claims_file.py); the report, the
        # slides and the course table only read it
        claims="{folder}/claims.json",
    log:
        "{folder}/logs/aggregate.log",
    wildcard_constraints:
        folder=folder_regex(FOLDERS),
    conda:
        CONDA_ENV
    # --manifests: the table holds this run's experiments only, not the leftovers of an
    # experiment an earlier run had enabled
    shell:
        "{CUDALAB} aggregate --results {wildcards.folder:q} --out {output.table:q}"
        " --manifests {input:q} > {log:q} 2>&1"
