# One figures rule per experiment, so each figure file is a declared output that
# `snakemake --report` can pick up (report() with the experiment's caption). `folder` is
# results/, or one GPU model's folder in a sweep: every model gets its own figures.
for _exp in EXPERIMENTS:

    rule:
        name:
            f"figures_{_exp}"
        input:
            "{folder}/results.csv",
        output:
            [
                report(
                    f"{{folder}}/figures/{_exp}/{fig}.png",
                    caption="../report/figure.rst",
                    category=REGISTRY[_exp].lesson.title,
                    subcategory="{folder}",
                    labels={"experiment": _exp, "figure": fig, "results": "{folder}"},
                )
                for fig in REGISTRY[_exp].lesson.figures
            ],
            [f"{{folder}}/figures/{_exp}/{fig}.svg" for fig in REGISTRY[_exp].lesson.figures],
        params:
            experiment=_exp,
            caption=REGISTRY[_exp].lesson.caption,
        log:
            f"{{folder}}/logs/figures_{_exp}.log",
        wildcard_constraints:
            folder=folder_regex(FOLDERS),
        localrule: True
        conda:
            CONDA_ENV
        shell:
            "{CUDALAB} figures {params.experiment:q} --table {input:q}"
            " --out {wildcards.folder:q}/figures > {log:q} 2>&1"


def all_figures():
    """Every figure of every folder (each model of a sweep has its own)."""
    return [f"{folder}/figures/{e}/{f}.png" for folder in FOLDERS for e in EXPERIMENTS
            for f in REGISTRY[e].lesson.figures]
