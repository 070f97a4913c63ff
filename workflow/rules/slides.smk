# Slides of the run (the first folder's table): one 16:9 figure per lesson that has a figure,
# as PNG and SVG at 1920x1080, and a one-file HTML deck (cudalab/slides.py).
SLIDE_EXPERIMENTS = [e for e in EXPERIMENTS if REGISTRY[e].lesson.figures]
SLIDES_DIR = f"{RESULTS}/slides"
SLIDES = [f"{SLIDES_DIR}/{e}.{ext}" for e in SLIDE_EXPERIMENTS for ext in ("png", "svg")]
SLIDES_DECK = f"{SLIDES_DIR}/index.html"


localrules:
    slides,


rule slides:
    input:
        table=TABLE,
        claims=CLAIMS,  # each slide's mark is the report's: read, not judged again
    output:
        slides=SLIDES,
        deck=SLIDES_DECK,
    params:
        out=SLIDES_DIR,
        experiments=SLIDE_EXPERIMENTS,
    log:
        f"{RESULTS}/logs/slides.log",
    conda:
        CONDA_ENV
    shell:
        "{CUDALAB} slides --table {input.table:q} --claims {input.claims:q}"
        " --out {params.out:q}"
        " --experiments {params.experiments:q} > {log:q} 2>&1"
