"""Fleet acceptance under Slurm: node acceptance (cudalab accept) on every node of a
partition, one job per node that holds all of the node's GPUs, and one page for the fleet.

    cudalab accept --slurm --partition P [--config C] [--out accept-fleet]
        -> <out>/jobs.json (the job of each node), <out>/<node>/ (that node's accept.csv,
           points.csv, links.csv, accept.html, node.json, slurm-<id>.out),
           <out>/fleet.csv (one row per GPU of the fleet), <out>/fleet.html
    cudalab accept --collect --out accept-fleet    (the page again, from what is there)

Each job runs `python -m cudalab.fleet node`, which runs acceptance on the node it landed on
and writes node.json (its exit status, the GPUs it saw, what it said), also where acceptance
could not run: the fleet page then says why for that node, instead of leaving it out.
"""

from __future__ import annotations

import argparse
import html
import math
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from cudalab import results, safe_text, site
from cudalab.links import slow_pairs

NODE_RECORD = "node.json"
JOBS = "jobs.json"
UNUSABLE = ("down", "drain", "drng", "fail", "maint", "inval", "unk", "boot", "futr")
POLL_S = 5.0


@dataclass(frozen=True)
class NodeJob:
    node: str
    gpus: int  # what the job asks for: every GPU of the node
    skip: str = ""  # why no job is submitted for this node ('' : one is)
    job_id: str = ""


def plan(nodes: list[site.Node], partition: str) -> list[NodeJob]:
    """One job per node of the partition, asking for all its GPUs; a node that is down or
    drained, or has fewer than two GPUs (acceptance compares a node's GPUs), gets none,
    with the reason."""
    mine = [n for n in nodes if n.partition == partition]
    out = []
    for n in sorted(mine, key=lambda n: n.name):
        state = n.state.lower().rstrip("*~#!%$@^-")
        skip = (f"node state {n.state}" if any(state.startswith(u) for u in UNUSABLE) else
                f"{n.n_gpus} GPU(s) in its gres: acceptance compares a node's GPUs with each "
                "other" if n.n_gpus < 2 else "")
        out.append(NodeJob(n.name, n.n_gpus, skip))
    return out


def sbatch_args(job: NodeJob, partition: str, out: Path, command: str, account: str = "",
                time_min: int = 30) -> list[str]:
    """The sbatch command of one node's job: that node alone, all its GPUs, the whole node
    (another job's work beside it would be what acceptance sees)."""
    folder = out / job.node
    args = ["sbatch", "--parsable", f"--partition={partition}", f"--nodelist={job.node}",
            "--nodes=1", "--ntasks=1", f"--gpus-per-node={job.gpus}", "--exclusive",
            f"--time={time_min}", f"--job-name=cudalab-accept-{job.node}",
            f"--output={folder}/slurm-%j.out", f"--chdir={Path.cwd()}"]
    if account:
        args.append(f"--account={account}")
    return args + ["--wrap", command]


def node_command(config: str, folder: Path) -> str:
    """What a node's job runs: acceptance there, with its record written whatever happens."""
    return " ".join(shlex.quote(a) for a in (sys.executable, "-m", "cudalab.fleet", "node",
                                             "--config", config, "--out", str(folder)))


def submit(partition: str, config: str, out: Path, say: Any = print, account: str = "",
           time_min: int = 30, command: Any = None) -> list[NodeJob]:
    """Submit one job per usable node of the partition; jobs.json records them.
    command(job, folder): the job's shell command (default: node_command)."""
    nodes = site.read_sinfo()
    jobs = plan(nodes, partition)
    if not jobs:
        have = sorted({n.partition for n in nodes})
        raise site.SiteError(f"partition {partition!r} has no nodes; partitions: "
                             f"{', '.join(have)}")
    done = []
    for job in jobs:
        if job.skip:
            say(f"  {job.node}: not submitted ({job.skip})")
            done.append(job)
            continue
        folder = out / job.node
        folder.mkdir(parents=True, exist_ok=True)
        cmd = command(job, folder) if command else node_command(config, folder)
        r = subprocess.run(sbatch_args(job, partition, out, cmd, account, time_min),
                           capture_output=True, text=True, timeout=60)
        if r.returncode != 0:
            why = (r.stderr.strip().splitlines() or [f"exit {r.returncode}"])[-1]
            say(f"  {job.node}: sbatch refused the job: {why}")
            done.append(NodeJob(job.node, job.gpus, f"sbatch refused it: {why}"))
            continue
        jid = r.stdout.strip().split(";")[0]
        say(f"  {job.node}: job {jid}, {job.gpus} GPU(s)")
        done.append(NodeJob(job.node, job.gpus, "", jid))
    results.write_json_atomic(out / JOBS, {"partition": partition,
                                           "jobs": [asdict(j) for j in done]})
    return done


def wait(jobs: list[NodeJob], say: Any = print, timeout_s: float | None = None) -> None:
    """Until no job of these is in squeue any more."""
    ids = [j.job_id for j in jobs if j.job_id]
    t0 = time.monotonic()
    while ids:
        r = subprocess.run(["squeue", "-h", "-j", ",".join(ids), "-o", "%i %T"],
                           capture_output=True, text=True, timeout=60)
        left = [ln.split()[0] for ln in r.stdout.splitlines() if ln.strip()]
        if r.returncode != 0 and "Invalid job id" not in r.stderr:
            left = ids  # the controller did not answer: ask again
        ids = [i for i in ids if i in left]
        if not ids:
            return
        if timeout_s is not None and time.monotonic() - t0 > timeout_s:
            say(f"cudalab accept: stopped waiting after {timeout_s:g} s; jobs "
                f"{', '.join(ids)} still queued or running (--collect later)")
            return
        time.sleep(POLL_S)


# -- on the node -------------------------------------------------------------------------
def write_node_record(folder: Path, rc: int, lines: list[str]) -> None:
    """What a node's job leaves for the fleet page, whatever acceptance did."""
    from cudalab import gpu_slots

    gpus = gpu_slots.usable_gpus({})
    results.write_json_atomic(folder / NODE_RECORD, {
        "node": socket.gethostname(), "slurm_job_id": os.environ.get("SLURM_JOB_ID", ""),
        "exit": rc, "gpus": [g.label() for g in gpus], "said": lines[-40:],
        "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z")})


def node_main(config: str, folder: Path) -> int:
    """`cudalab accept` on this node, in a process of its own (whatever becomes of it, the
    record is written), its output passed on to the job's log as it comes."""
    folder.mkdir(parents=True, exist_ok=True)
    lines: list[str] = []
    rc = 3
    try:
        with subprocess.Popen([sys.executable, "-m", "cudalab.cli", "accept", "--config",
                               config, "--out", str(folder)], stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) as p:
            for line in p.stdout or ():
                print(line, end="", flush=True)
                lines.append(line.rstrip("\n"))
        rc = p.returncode
    except OSError as exc:
        lines.append(f"error: acceptance could not start: {exc}")
    finally:
        write_node_record(folder, rc, lines)
    return rc


# -- the fleet ---------------------------------------------------------------------------
def collect(out: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(one row per node, one row per GPU) from the node folders under out."""
    meta = results.read_json(out / JOBS) or {}
    jobs = {j["node"]: j for j in meta.get("jobs", [])}
    names = sorted(set(jobs) | {p.parent.name for p in out.glob(f"*/{NODE_RECORD}")}
                   | {p.parent.name for p in out.glob("*/accept.csv")})
    nodes, gpus = [], []
    for name in names:
        node, rows = _node(out / name, name, jobs.get(name, {}))
        nodes.append(node)
        gpus += rows
    cols = ["node", "gpu_index", "name", "pci_bus_id", "uuid", "verdict", "why",
            "median_ratio", "worst_ratio", "worst_point"]
    return pd.DataFrame(nodes), pd.DataFrame(gpus, columns=cols)


def _node(folder: Path, name: str, job: dict[str, Any]) -> tuple[dict[str, Any], list]:
    rec = results.read_json(folder / NODE_RECORD)
    base = {"node": name, "job_id": job.get("job_id", ""), "gpus": 0, "models": "",
            "outliers": 0, "slow_links": "", "verdict": "", "why": "",
            "page": f"{name}/accept.html" if (folder / "accept.html").is_file() else ""}
    if job.get("skip"):
        return base | {"verdict": "not run", "why": job["skip"]}, []
    if not (folder / "accept.csv").is_file():
        if rec is None:
            return base | {"verdict": "no result", "why": _no_record(folder, job)}, []
        said = [ln for ln in rec.get("said", []) if ln.startswith(("error", "warning"))]
        why = said[-1] if said else f"acceptance exited {rec.get('exit')}"
        return base | {"verdict": "cannot run", "why": why.removeprefix("error: ")}, []
    table = pd.read_csv(folder / "accept.csv")
    rows = [{"node": name, **r} for r in table.to_dict("records")]
    bad = table[table["verdict"] != "ok"]
    slow = ""
    if (folder / "links.csv").is_file():
        s = slow_pairs(pd.read_csv(folder / "links.csv"))
        slow = "; ".join(f"GPU {r.src} -> GPU {r.dst} ({r.link}) {r.gbps:.0f} GB/s, "
                         f"{r.share_of_median:.0%} of its link type's median"
                         for r in s.itertuples())
    why = "; ".join(f"GPU {r.gpu_index}: {r.why}" for r in bad.itertuples())
    verdict = "outlier" if len(bad) or slow else "ok"
    return base | {"gpus": len(table), "outliers": len(bad), "slow_links": slow,
                   "models": ", ".join(sorted(set(table["name"].astype(str)))),
                   "verdict": verdict, "why": "; ".join(x for x in (why, slow) if x)}, rows


def _no_record(folder: Path, job: dict[str, Any]) -> str:
    logs = sorted(folder.glob("slurm-*.out"))
    tail = ""
    if logs:
        lines = logs[-1].read_text(errors="replace").strip().splitlines()
        tail = f"; its log ends: {' | '.join(lines[-2:])}" if lines else ""
    jid = job.get("job_id")
    return (f"job {jid} left no {NODE_RECORD} (still queued or running, cancelled, or "
            f"killed: sacct -j {jid}){tail}" if jid else f"no {NODE_RECORD} here{tail}")


def write(out: Path, nodes: pd.DataFrame, gpus: pd.DataFrame) -> Path:
    """fleet.csv (one row per GPU) and fleet.html (nodes first, outliers first)."""
    with results.atomic_path(out / "fleet.csv") as tmp:
        safe_text.write_frame(gpus, tmp)
    page = fleet_page(nodes, gpus, (results.read_json(out / JOBS) or {}).get("partition", ""))
    with results.atomic_path(out / "fleet.html") as tmp:
        tmp.write_text(page)
    return out / "fleet.html"


def headline(nodes: pd.DataFrame, gpus: pd.DataFrame) -> str:
    n_bad = int((gpus["verdict"] != "ok").sum()) if len(gpus) else 0
    nodes_bad = int((nodes["verdict"] == "outlier").sum()) if len(nodes) else 0
    missing = int((~nodes["verdict"].isin(["ok", "outlier"])).sum()) if len(nodes) else 0
    text = (f"{len(nodes)} node(s), {len(gpus)} GPU(s) judged: "
            + (f"{n_bad} outlier GPU(s) on {nodes_bad} node(s)" if nodes_bad else
               "no outlier"))
    return text + (f"; {missing} node(s) without a verdict" if missing else "")


def fleet_page(nodes: pd.DataFrame, gpus: pd.DataFrame, partition: str) -> str:
    esc = html.escape
    order = {"outlier": 0, "cannot run": 1, "no result": 2, "not run": 3, "ok": 4}
    nodes = nodes.sort_values(["verdict", "node"], key=lambda s: s.map(order).fillna(5)
                              if s.name == "verdict" else s) if len(nodes) else nodes
    node_rows = "".join(
        f"<tr class='{esc(str(r.verdict)).replace(' ', '-')}'><td>"
        + (f"<a href='{esc(r.page)}'>{esc(r.node)}</a>" if r.page else esc(r.node))
        + f"</td><td>{r.gpus or '&mdash;'}</td><td>{esc(r.models) or '&mdash;'}</td>"
        f"<td><b>{esc(r.verdict)}</b></td><td>{esc(r.why) or '&mdash;'}</td>"
        f"<td>{esc(str(r.job_id)) or '&mdash;'}</td></tr>" for r in nodes.itertuples())
    g = gpus.sort_values(["verdict", "node", "gpu_index"], key=lambda s: s.ne("outlier")
                         if s.name == "verdict" else s) if len(gpus) else gpus
    gpu_rows = "".join(
        f"<tr class='{esc(str(r.verdict))}'><td>{esc(r.node)}</td><td>{r.gpu_index}</td>"
        f"<td>{esc(str(r.name))}</td><td>{esc(str(r.pci_bus_id))}</td>"
        f"<td><b>{esc(str(r.verdict))}</b></td><td>{_num(r.median_ratio)}</td>"
        f"<td>{esc(str(r.why)) if isinstance(r.why, str) and r.why else '&mdash;'}</td></tr>"
        for r in g.itertuples())
    return f"""<!doctype html><html lang="en"><head><meta charset="utf-8">
<title>cudalab fleet acceptance{': ' + esc(partition) if partition else ''}</title><style>
body{{font:16px/1.4 system-ui,sans-serif;margin:2em;max-width:80em}}
table{{border-collapse:collapse;margin-bottom:1.5em}}
td,th{{border:1px solid #bbb;padding:.3em .6em;text-align:left;vertical-align:top}}
tr.outlier{{background:#fde2e1}}tr.ok{{background:#e6f4ea}}
tr.cannot-run,tr.no-result,tr.not-run{{background:#fff4d6}}</style></head><body>
<h1>Fleet acceptance{': partition ' + esc(partition) if partition else ''}</h1>
<p><b>{esc(headline(nodes, gpus))}.</b> Each node ran <code>cudalab accept</code> in a job of
its own holding all its GPUs: the same grid on every GPU at once, each GPU compared with the
median of the node's other GPUs (the verdict of <code>cudalab compare</code>), its telemetry
and ECC counts, and every pair's link. A node's name links to its own page.</p>
<h2>Nodes</h2>
<table><thead><tr><th>node</th><th>GPUs</th><th>model</th><th>verdict</th><th>why</th>
<th>Slurm job</th></tr></thead><tbody>{node_rows}</tbody></table>
<h2>Every GPU</h2>
<table><thead><tr><th>node</th><th>GPU</th><th>model</th><th>PCI bus</th><th>verdict</th>
<th>median time ratio to the node's other GPUs</th><th>why</th></tr></thead>
<tbody>{gpu_rows}</tbody></table>
<p>Every GPU: fleet.csv; each node's points, links and runs: its folder.</p>
</body></html>"""


def _num(x: Any) -> str:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return "&mdash;"
    return "&mdash;" if math.isnan(v) else f"{v:.3f}"


def run(args: argparse.Namespace, say: Any = print) -> int:
    """`cudalab accept --slurm` / `--collect`: 0 every node ok, 1 an outlier (GPU or link),
    2 a node without a verdict or nothing could be submitted."""
    out = Path(args.out)
    if not args.collect:
        if not args.partition:
            say("error: --slurm needs --partition P (sinfo lists them)")
            return 2
        if shutil.which("sbatch") is None:
            say("error: sbatch not found: run `cudalab accept --slurm` on a Slurm login node")
            return 2
        try:
            say(f"cudalab accept: one job per node of partition {args.partition}")
            jobs = submit(args.partition, args.config, out, say, args.account, args.time_min)
        except site.SiteError as exc:
            say(f"error: {exc}")
            return 2
        if not args.no_wait:
            wait(jobs, say)
    nodes, gpus = collect(out)
    if nodes.empty:
        say(f"error: {out} holds no node's result ({JOBS}, <node>/{NODE_RECORD})")
        return 2
    page = write(out, nodes, gpus)
    for r in nodes.itertuples():
        say(f"  {r.node}: {r.verdict}" + (f": {r.why}" if r.why else ""))
    say(f"cudalab accept: {page} ({headline(nodes, gpus)})")
    if (nodes["verdict"] == "outlier").any():
        return 1
    return 0 if nodes["verdict"].isin(["ok", "not run"]).all() else 2


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cudalab.fleet", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="what", required=True)
    n = sub.add_parser("node", help="acceptance of this node (what each job runs)")
    n.add_argument("--config", default="config.yaml")
    n.add_argument("--out", required=True)
    a = p.parse_args(argv)
    return node_main(a.config, Path(a.out))


if __name__ == "__main__":
    raise SystemExit(main())
