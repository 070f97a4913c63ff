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
    script:
        "../../scripts/aggregate.py"
