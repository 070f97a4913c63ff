# One figures rule per experiment, so each figure file is a declared output that
# `snakemake --report` can pick up (report() with the experiment's caption).
for _exp in EXPERIMENTS:

    rule:
        name:
            f"figures_{_exp}"
        input:
            TABLE,
        output:
            [
                report(
                    f"{RESULTS}/figures/{_exp}/{fig}.png",
                    caption="../report/figure.rst",
                    category=REGISTRY[_exp].title,
                    labels={"experiment": _exp, "figure": fig},
                )
                for fig in REGISTRY[_exp].figures
            ],
            [f"{RESULTS}/figures/{_exp}/{fig}.svg" for fig in REGISTRY[_exp].figures],
        params:
            experiment=_exp,
            out=f"{RESULTS}/figures",
            caption=REGISTRY[_exp].caption,
        log:
            f"{RESULTS}/logs/figures_{_exp}.log",
        localrule: True
        conda:
            CONDA_ENV
        shell:
            "{CUDALAB} figures {params.experiment:q} --table {input:q} --out {params.out:q}"
            " > {log:q} 2>&1"
