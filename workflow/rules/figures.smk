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
            # the lesson's figure as the handout prints it (cudalab/handout.py)
            [f"{{folder}}/figures/{_exp}/handout.png"] * bool(REGISTRY[_exp].lesson.figures),
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


# The run's own figures, beside each lesson's: the rooflines (the run's and each experiment's
# that asks for one) and the GPU telemetry of every job and of the whole run, each folder
# with an index of its captions (cudalab/run_figures.py). The report only embeds them.
# Folders, not files: which rooflines have points, and the job ids, are known at run time.
RUN_FIGURE_DIRS = ("_roofline", "_telemetry")
RUN_FIGURE_THREADS = 4  # processes drawing the run figures (Snakemake caps it at --cores)


rule run_figures:
    input:
        "{folder}/results.csv",
    output:
        directory("{folder}/figures/_roofline"),
        directory("{folder}/figures/_telemetry"),
    log:
        "{folder}/logs/run_figures.log",
    wildcard_constraints:
        folder=folder_regex(FOLDERS),
    localrule: True
    # a figure a task: a run of several GPUs draws a telemetry figure per job (4 GPUs, split
    # lessons: 25 jobs, 22 s in one process)
    threads: RUN_FIGURE_THREADS
    conda:
        CONDA_ENV
    # --results: the folder's manifests and telemetry/ (its measure jobs')
    shell:
        "{CUDALAB} run-figures --table {input:q} --results {wildcards.folder:q}"
        " --out {wildcards.folder:q}/figures --jobs {threads} > {log:q} 2>&1"


def run_figure_dirs():
    """The run figures' folders of every folder (each model of a sweep has its own)."""
    return [f"{folder}/figures/{d}" for folder in FOLDERS for d in RUN_FIGURE_DIRS]


# This run against the report's baselines (report.baselines and, in a sweep, the other
# models' folders), compared once here: the table (comparison.csv, which the report renders)
# and one time-ratio figure per experiment. The baselines are a param: changing them
# compares again.
rule compare_figures:
    input:
        table=TABLE,
        tables=[f"{f}/results.csv" for f in FOLDERS[1:]],  # the models set beside it
    output:
        directory(f"{MEASURED}/figures/_compare"),
    params:
        baselines=config["report"]["baselines"],
        out=f"{MEASURED}/figures",
    log:
        f"{MEASURED}/logs/compare_figures.log",
    localrule: True
    conda:
        CONDA_ENV
    shell:
        "{CUDALAB} compare-figures --config {CONFIG_JSON:q} --table {input.table:q}"
        " --out {params.out:q} > {log:q} 2>&1"
