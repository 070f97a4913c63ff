"""What a Slurm cluster offers (from `sinfo`) and whether a config's `slurm:` request fits.

One model of the cluster serves three users: `cudalab site` (a table of partitions and a
suggested `slurm:` block), `cudalab plan` (does each job's request fit a node of its
partition?) and the workflow's start-up plan under Slurm.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudalab.slurm_units import parse_time

# one line per (node, partition): name|partition|cpus|memory MB|gres|time limit|avail|state|features
SINFO_FORMAT = "%N|%P|%c|%m|%G|%l|%a|%T|%f"
_GPU_GRES = re.compile(r"(?<![\w-])gpu(?::([^:(),\s]+))?:(\d+)")


class SiteError(RuntimeError):
    """sinfo could not be read (not a Slurm host, or the controller did not answer)."""


@dataclass(frozen=True)
class Node:
    name: str
    partition: str
    default: bool  # the cluster's default partition (sinfo marks it with '*')
    cpus: int
    mem_mb: int
    gpus: dict[str, int] = field(hash=False)  # GPU model ('' = untyped) -> count
    time_limit_min: int | None  # None: no limit
    available: bool  # partition up
    state: str
    features: tuple[str, ...] = ()

    @property
    def n_gpus(self) -> int:
        return sum(self.gpus.values())


def parse_gres(text: str) -> dict[str, int]:
    """'gpu:a100:4(S:0-1),gpu:h100:2' -> {'a100': 4, 'h100': 2}; 'gpu:2' -> {'': 2}."""
    gpus: dict[str, int] = {}
    for model, count in _GPU_GRES.findall(text or ""):
        gpus[model] = gpus.get(model, 0) + int(count)
    return gpus


def _int(text: str) -> int:
    return int(re.match(r"\d*", text.strip()).group() or 0)


def parse_sinfo(text: str) -> list[Node]:
    """Nodes from `sinfo -h -N -o SINFO_FORMAT` (one line per node and partition)."""
    nodes = []
    for line in text.splitlines():
        f = line.strip().split("|")
        if len(f) < 9:
            continue
        feats = tuple(x for x in f[8].split(",") if x and x != "(null)")
        nodes.append(Node(name=f[0], partition=f[1].rstrip("*"), default=f[1].endswith("*"),
                          cpus=_int(f[2]), mem_mb=_int(f[3]), gpus=parse_gres(f[4]),
                          time_limit_min=parse_time(f[5]), available=f[6] == "up",
                          state=f[7], features=feats))
    return nodes


def read_sinfo(timeout_s: float = 20) -> list[Node]:
    exe = shutil.which("sinfo")
    if exe is None:
        raise SiteError("sinfo not found: run this on a Slurm login node")
    try:
        out = subprocess.run([exe, "-h", "-N", "-o", SINFO_FORMAT], capture_output=True,
                             text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        raise SiteError(f"sinfo did not answer in {timeout_s:.0f} s") from exc
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or [f"exit code {out.returncode}"])[-1]
        raise SiteError(f"sinfo failed ({last})")
    nodes = parse_sinfo(out.stdout)
    if not nodes:
        raise SiteError("sinfo lists no nodes")
    return nodes


# -- fitting a request -----------------------------------------------------------------------
def partitions(nodes: Iterable[Node]) -> dict[str, list[Node]]:
    out: dict[str, list[Node]] = {}
    for n in nodes:
        out.setdefault(n.partition, []).append(n)
    return out


def default_partition(nodes: list[Node]) -> str:
    return next((n.partition for n in nodes if n.default), nodes[0].partition if nodes else "")


def gpu_models(nodes: Iterable[Node]) -> dict[str, set[str]]:
    """GPU model -> partitions that have it."""
    out: dict[str, set[str]] = {}
    for n in nodes:
        for model in n.gpus:
            if model:
                out.setdefault(model, set()).add(n.partition)
    return out


def _models_text(nodes: list[Node]) -> str:
    models = gpu_models(nodes)
    if not models:
        return "this cluster lists no typed GPUs (use gpu_model: '')"
    return "GPU models here: " + ", ".join(
        f"{m} (partition {', '.join(sorted(p))})" for m, p in sorted(models.items()))


def fit_problems(slurm: dict[str, Any], nodes: list[Node], needs_gpu: bool) -> list[str]:
    """What in a `slurm:` block no node can satisfy, each with Slurm's reason, the limit and
    the fix (empty list: it fits). A partition list ('gpu,debug': Slurm takes the first that
    can run the job) fits if one of them does. A GPU-model sweep is checked model by model."""
    models = list(slurm.get("gpu_models") or [])
    if models:
        out: list[str] = []
        for m in models:
            out += [p for p in fit_problems({**slurm, "gpu_models": [], "gpu_model": m},
                                            nodes, True) if p not in out]
        return [p.replace("slurm.gpu_model:", "slurm.gpu_models:") for p in out]
    parts = partitions(nodes)
    names = (slurm.get("partition") or default_partition(nodes)).split(",")
    unknown = [p for p in names if p not in parts]
    if unknown:
        return [f"slurm.partition: {', '.join(map(repr, unknown))} does not exist; "
                f"fix: one of {', '.join(parts)} (or '' for the cluster's default)"]
    each = [_fit_partition(slurm, p, parts[p], nodes, needs_gpu) for p in names]
    return [] if any(not e for e in each) else [x for e in each for x in e]


def _fit_gpu(model: str, part: str, nodes: list[Node]) -> str:
    """Why no node of the partition has the GPU the job asks for (sbatch refuses it, or it
    pends with ReqNodeNotAvail / PartitionConfig)."""
    if model:
        where = sorted(gpu_models(nodes).get(model, ()))
        return (f"slurm.gpu_model: no node of partition {part!r} has GPU model {model!r} "
                "(the job could never start); fix: "
                + (f"slurm.partition: {where[0]} (partition {', '.join(where)} has)" if where
                   else f"a model this cluster has; {_models_text(nodes)}"))
    with_gpus = sorted({n.partition for n in nodes if n.n_gpus})
    return (f"slurm.partition: {part!r} has no GPUs (the job could never start); fix: one of "
            f"the partitions with GPUs: {', '.join(with_gpus) or 'none'}")


def _fit_partition(slurm: dict[str, Any], part: str, cands: list[Node], nodes: list[Node],
                   needs_gpu: bool) -> list[str]:
    model = slurm.get("gpu_model") or ""
    if needs_gpu:
        cands = [n for n in cands if (n.gpus.get(model, 0) if model else n.n_gpus) > 0]
        if not cands:
            return [_fit_gpu(model, part, nodes)]
    problems = []
    what = f"partition {part!r}" + (f" with GPU model {model!r}" if needs_gpu and model else "")
    for key, attr, unit in (("cpus_per_task", "cpus", "CPUs"), ("mem_mb", "mem_mb", "MB")):
        want, most = slurm.get(key), max(getattr(n, attr) for n in cands)
        if want and want > most:
            problems.append(f"slurm.{key}: {want} but the largest node of {what} has "
                            f"{most} {unit} (PartitionConfig: the job would wait for ever); "
                            f"fix: slurm.{key}: {most} or less")
    if not problems and not any(n.cpus >= slurm.get("cpus_per_task", 0)
                                and n.mem_mb >= slurm.get("mem_mb", 0) for n in cands):
        problems.append(f"slurm.cpus_per_task and slurm.mem_mb: no single node of {what} has "
                        "both (PartitionConfig); fix: lower one of them (`cudalab site`)")
    feature = slurm.get("constraint") or ""
    if re.fullmatch(r"[\w.-]+", feature) and not any(feature in n.features for n in cands):
        have = sorted({f for n in cands for f in n.features})
        problems.append(f"slurm.constraint: no node of {what} has feature {feature!r} "
                        f"(BadConstraints); fix: one of {', '.join(have) or 'none'}, or ''")
    limits = [n.time_limit_min for n in cands]
    runtime = slurm.get("runtime_min")
    if runtime and None not in limits and runtime > max(limits):
        problems.append(f"slurm.runtime_min: {runtime} but partition {part!r} allows at most "
                        f"{max(limits)} minutes (PartitionTimeLimit: the job would wait for "
                        f"ever); fix: slurm.runtime_min: {max(limits)} or less")
    return problems


# -- suggesting a block ----------------------------------------------------------------------
def suggest(nodes: list[Node], current: dict[str, Any]) -> dict[str, Any]:
    """A `slurm:` block that fits: the default partition if it has GPUs (else the first
    that does), its most common GPU model, and the current sizes capped at one GPU's share
    of its nodes (a job uses one GPU: a request of the whole node would leave the node's
    other GPUs idle while it runs)."""
    parts = partitions(nodes)
    gpu_parts = [p for p, ns in parts.items() if any(n.n_gpus for n in ns)]
    default = default_partition(nodes)
    part = default if default in gpu_parts or not gpu_parts else gpu_parts[0]
    ns = [n for n in parts[part] if n.n_gpus] or parts[part]
    counts: dict[str, int] = {}
    for n in ns:
        for m, c in n.gpus.items():
            counts[m] = counts.get(m, 0) + c
    model = max(sorted(counts), key=lambda m: counts[m]) if counts else ""
    if model:
        ns = [n for n in ns if n.gpus.get(model)]
    limits = [n.time_limit_min for n in ns if n.time_limit_min is not None]
    runtime = current.get("runtime_min", 60)
    return {
        "partition": part,
        "account": current.get("account", ""),
        "gpu_model": model,
        "runtime_min": min([runtime, *limits]),
        "mem_mb": min(current.get("mem_mb", 16000), min(_share(n.mem_mb, n) for n in ns)),
        "cpus_per_task": min(current.get("cpus_per_task", 4), min(_share(n.cpus, n) for n in ns)),
        "modules": list(current.get("modules", [])),
    }


def _share(amount: int, node: Node) -> int:
    """One GPU's share of a node's CPUs or memory (all of it on a node without GPUs)."""
    return max(1, amount // max(1, node.n_gpus))


def table_lines(nodes: list[Node]) -> list[str]:
    rows = [("partition", "avail", "time limit", "nodes", "CPUs", "memory MB", "GPUs")]
    for part, ns in partitions(nodes).items():
        limit = ns[0].time_limit_min
        gpus = sorted({f"{m or 'gpu'}:{c}" for n in ns for m, c in n.gpus.items()})
        rows.append((part + ("*" if ns[0].default else ""), "up" if ns[0].available else "down",
                     "none" if limit is None else f"{limit} min", str(len(ns)),
                     _span(n.cpus for n in ns), _span(n.mem_mb for n in ns),
                     ", ".join(gpus) or "-"))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]


def _span(values: Iterable[int]) -> str:
    v = sorted(set(values))
    return str(v[0]) if len(v) == 1 else f"{v[0]}-{v[-1]}"


def block_yaml(block: dict[str, Any]) -> list[str]:
    import yaml

    text = yaml.safe_dump({"slurm": block}, sort_keys=False, default_flow_style=None)
    return text.rstrip().splitlines()


# -- used by `cudalab plan` and the workflow -------------------------------------------------
def needs_gpu(config: dict[str, Any]) -> bool:
    """Whether the run's jobs ask for a GPU: a GPU point, or a class run (every judge job
    asks for one, on slurm.gpu_model)."""
    from cudalab.config import enabled_experiments
    from cudalab.experiments import REGISTRY

    if (config.get("exercises") or {}).get("submissions"):
        return True
    return any(p.gpu for e in enabled_experiments(config) for p in REGISTRY[e].grid(config))


@dataclass
class FitCheck:
    """The request against sinfo (and sacctmgr's limits): checked (sinfo answered) and what
    does not fit."""

    checked: bool
    problems: list[str]
    partition: str = ""
    error: str = ""  # why it was not checked
    limits: str = ""  # the QOS and account whose limits were checked ('' = none read)

    @property
    def fits(self) -> bool:
        """False only where sinfo answered and a request cannot fit."""
        return not (self.checked and self.problems)


SLURM_EXTRA = 'pip install -e . (the plugin is one of its dependencies)'
# what the executor plugin runs on the login node: submit, poll, cancel
SUBMIT_TOOLS = ("sbatch", "squeue", "scancel")


def slurm_missing(plugin_installed: bool | None = None,
                  which: Callable[[str], str | None] = shutil.which) -> str:
    """One line saying why `snakemake --profile slurm` cannot submit from here, '' if it can:
    the executor plugin is not installed, or this machine has no Slurm commands."""
    if plugin_installed is None:
        plugin_installed = importlib.util.find_spec("snakemake_executor_plugin_slurm") is not None
    if not plugin_installed:
        return (f"cudalab: --profile slurm needs the Slurm executor plugin, not installed here: "
                f"{SLURM_EXTRA}")
    missing = [t for t in SUBMIT_TOOLS if which(t) is None]
    if missing:
        return (f"cudalab: --profile slurm, but this machine has no Slurm ({', '.join(missing)} "
                "not on PATH): run it on the cluster's login node, or plain `snakemake` to "
                "measure here; nothing was submitted")
    return ""


def slurm_not_answering(fit: FitCheck) -> str:
    """One line where Slurm's commands are here but its controller did not answer sinfo
    (a dead or unreachable controller: sbatch would fail too), '' otherwise."""
    if fit.checked or fit.error in ("", "sinfo not found"):
        return ""
    return (f"cudalab: --profile slurm, but Slurm does not answer here ({fit.error}): run it "
            "where `sinfo` answers (the cluster's login node); nothing was submitted")


def check_fit(config: dict[str, Any], nodes: list[Node] | None = None,
              limits: Any = None) -> FitCheck:
    """The config's request against this cluster (not checked where sinfo is absent or
    does not answer: a laptop, a login node with a dead controller), and against the QOS
    and association limits (`limits`: a slurm_limits.SiteLimits; read from sacctmgr where
    the nodes are read from sinfo)."""
    from cudalab import slurm_limits

    if nodes is None:
        if shutil.which("sinfo") is None:
            return FitCheck(False, [], error="sinfo not found")
        try:
            nodes = read_sinfo(timeout_s=10)
        except SiteError as exc:
            return FitCheck(False, [], error=str(exc))
        limits = slurm_limits.read_limits() if limits is None else limits
    part = config["slurm"]["partition"] or default_partition(nodes)
    gpu = needs_gpu(config)
    fit = FitCheck(True, fit_problems(config["slurm"], nodes, gpu), part)
    if limits is not None:
        fit.problems += slurm_limits.config_problems(config["slurm"], gpu, limits,
                                                     part.split(",")[0])
        fit.limits = slurm_limits.checked_what(config["slurm"], limits)
    return fit


def fit_lines(fit: FitCheck, quiet: bool = False) -> list[str]:
    if not fit.checked:
        return [] if quiet or fit.error == "sinfo not found" else [
            f"  Slurm request not checked: {fit.error}"]
    if not fit.problems:
        within = f"; within the limits of {fit.limits} (sacctmgr)" if fit.limits else ""
        return [f"  Slurm request (sinfo): fits partition {fit.partition!r}{within}"]
    source = "sinfo, sacctmgr" if fit.limits else "sinfo"
    return [f"  Slurm request ({source}) does not fit, the jobs would wait for ever:"] + [
        f"    - {p}" for p in fit.problems] + ["    see `cudalab site` for what this cluster has"]


def plan_lines(config: dict[str, Any], nodes: list[Node] | None = None,
               quiet: bool = False) -> list[str]:
    """Whether the jobs' request fits a node (nothing where sinfo is absent, or fails and
    quiet is set)."""
    return fit_lines(check_fit(config, nodes), quiet)


# -- `cudalab site` ----------------------------------------------------------------------------
def cmd_site(a: argparse.Namespace) -> int:
    from cudalab import config as cfg
    from cudalab import slurm_limits

    try:
        nodes = parse_sinfo(Path(a.sinfo).read_text()) if a.sinfo else read_sinfo()
    except (SiteError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        config = cfg.load(a.config) if Path(a.config).is_file() else None
    except cfg.ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    current = config["slurm"] if config else {}
    if not a.sinfo and slurm_missing():  # this is the login node: can it submit?
        print(slurm_missing(), file=sys.stderr)
    print("Slurm partitions (sinfo; * = default):")
    print("\n".join("  " + line for line in table_lines(nodes)))
    print(f"  {_models_text(nodes)}")
    print("\nSuggested block for config.yaml (the sizes of one experiment job, capped at the "
          "partition's nodes; add modules such as cuda/12.4 if nvcc needs `module load`):\n")
    print("\n".join(block_yaml(suggest(nodes, current))))
    limits = None if a.sinfo else slurm_limits.read_limits()
    if limits is not None:
        print(f"\nYour accounts and QOS (sacctmgr, user {limits.user}):")
        print("\n".join("  " + line for line in slurm_limits.summary_lines(limits)))
    if config is None:
        return 0
    problems = fit_problems(current, nodes, needs_gpu(config))
    if limits is not None:
        problems += slurm_limits.config_problems(current, needs_gpu(config), limits,
                                                 current["partition"].split(",")[0])
    if problems:
        print(f"\n{a.config}: its slurm: request does not fit any node:")
        print("\n".join(f"  - {p}" for p in problems))
        return 1
    print(f"\n{a.config}: its slurm: request fits.")
    return 0


def add_parser(sub: Any) -> None:
    s = sub.add_parser("site", help="read sinfo; suggest a slurm: block; check the config's")
    s.add_argument("config", nargs="?", default="config.yaml")
    s.add_argument("--sinfo", help=f"read a saved `sinfo -h -N -o '{SINFO_FORMAT}'` instead")
    s.set_defaults(fn=cmd_site)
