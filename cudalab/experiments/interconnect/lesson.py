"""The interconnect lesson: what the links between GPUs carry, against the course's numbers
(NVLink 300 GB/s, PCIe 12-32 GB/s, "the host link is the biggest bottleneck") and this
machine's own link specs. Every claim first asks the topology row how many GPUs there are:
with one it does not apply, without a GPU it was not measured."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from cudalab import fmt
from cudalab.experiments.interconnect import answers, spec
from cudalab.experiments.lesson import (
    LARGE_FRACTION,
    Claim,
    Judgement,
    Lesson,
    TryThis,
    judged,
    no_data,
    not_applicable,
    slower,
)
from cudalab.experiments.questions import Question

if TYPE_CHECKING:
    from cudalab.run_ceilings import Ceilings

COURSE_NVLINK_GBPS = 300.0  # the course's NVLink figure
PEER_GAIN = 2.0  # peer access on is "faster" than off (through the host) by this factor
HOST_GAP = 2.0  # the host path is "the bottleneck": the peer copy this many times faster
BOTH_WAYS = 1.5  # both directions at once move this many times one direction (full duplex)
REMOTE_SHARE = 0.5  # a kernel reading the other GPU's memory reaches this share of the copy


def _gate(d: pd.DataFrame) -> Judgement | None:
    """Why no claim can be judged on this run (None: there are pairs to judge)."""
    topo = spec.topology_row(d)
    if topo is None:
        return no_data("not measured: no topology row in this run")
    n = pd.to_numeric(pd.Series([topo.get("m_gpus")]), errors="coerce").iloc[0]
    if not math.isfinite(n) or n < 1:
        return no_data("not measured: no GPU here")
    if n < 2:
        return not_applicable(f"not applicable: this machine has {int(n)} GPU")
    return None


def _pairs(d: pd.DataFrame, mode: str) -> pd.Series:
    """GB/s per ordered pair of the mode's rows measured ok."""
    f = spec.links_frame(d)
    f = f[(f["mode"] == mode) & f["gbps"].notna()]
    return f.set_index(["src", "dst"])["gbps"]


def _ratio_claim(d: pd.DataFrame, num: str, den: str, want: float, what: str) -> Judgement:
    """Holds where the median over pairs of num's GB/s over den's is at least `want`."""
    gate = _gate(d)
    if gate is not None:
        return gate
    a, b = _pairs(d, num), _pairs(d, den)
    both = a.index.intersection(b.index)
    if not len(both):
        f = spec.links_frame(d)
        if (f["mode"].isin([num, den]) & (f["status"] == "skipped")).any():
            return not_applicable("not applicable: no pair of GPUs here has peer access")
        return no_data(f"not measured: no pair with both {num} and {den} measured")
    r = (a[both] / b[both]).median()
    return judged(bool(r >= want), f"{what}: median over {len(both)} pair(s) "
                  f"{fmt.ratio(r)} ({fmt.bandwidth(a[both].median())} against "
                  f"{fmt.bandwidth(b[both].median())})")


def _peer_beats_no_peer(d: pd.DataFrame, c: Ceilings) -> Judgement:
    return _ratio_claim(d, "peer", "no_peer", PEER_GAIN, "peer access on over off")


def _host_is_bottleneck(d: pd.DataFrame, c: Ceilings) -> Judgement:
    return _ratio_claim(d, "peer", "host_staged", HOST_GAP,
                        "direct peer copy over the copy staged through host memory")


def _both_ways(d: pd.DataFrame, c: Ceilings) -> Judgement:
    return _ratio_claim(d, "bidirectional", "peer", BOTH_WAYS,
                        "both directions at once over one direction")


def _remote_read(d: pd.DataFrame, c: Ceilings) -> Judgement:
    return _ratio_claim(d, "remote_read", "peer", REMOTE_SHARE,
                        "a kernel reading the other GPU over the copy engine's copy")


def _nvlink_course(d: pd.DataFrame, c: Ceilings) -> Judgement:
    gate = _gate(d)
    if gate is not None:
        return gate
    f = spec.links_frame(d)
    nv = f[(f["mode"] == "peer") & (f["link_kind"] == "NVLink")]
    if nv.empty:
        return not_applicable("not applicable: no pair here is joined by NVLink "
                              "(nvidia-smi topo -m)")
    if nv["gbps"].isna().all():
        return no_data("not measured: no NVLink pair's peer copy measured ok")
    m = nv["gbps"].median()
    return judged(bool(m >= COURSE_NVLINK_GBPS),
                  f"NVLink peer copy: median {fmt.bandwidth(m)} over {nv['gbps'].notna().sum()}"
                  f" pair(s) ({', '.join(sorted(set(nv['link'])))}), the course "
                  f"{fmt.bandwidth(COURSE_NVLINK_GBPS)}")


def _near_spec(d: pd.DataFrame, c: Ceilings) -> Judgement:
    gate = _gate(d)
    if gate is not None:
        return gate
    f = spec.links_frame(d)
    peer = f[(f["mode"] == "peer") & f["gbps"].notna() & f["spec"].notna()]
    if peer.empty:
        return no_data("not measured: no peer copy with a known theoretical bandwidth "
                       "(NVLink generation or NVML's PCIe link)")
    share = peer["gbps"] / peer["spec"]
    worst = peer.loc[share.idxmin()]
    return judged(bool(share.min() >= LARGE_FRACTION),
                  f"lowest share {fmt.percent(share.min(), fraction=True)}: GPU {worst['src']}"
                  f" -> GPU {worst['dst']} ({worst['link']}) {fmt.bandwidth(worst['gbps'])} "
                  f"of {fmt.bandwidth(worst['spec'])} per direction in theory")


def _mode(name: str):
    return lambda d: d["variant"].astype(str) == name


def _nvlink_peer(d: pd.DataFrame) -> pd.Series:
    kind = d["m_link"].astype(str).map(spec.kind) if "m_link" in d else "unknown"
    return (d["variant"].astype(str) == "peer") & (kind == "NVLink")


CLAIMS = (
    Claim(f"With peer access on, a copy from one GPU to another is at least "
          f"{PEER_GAIN:g}× faster than with it off (the driver then stages it through the "
          "host)", _peer_beats_no_peer, lambda d: slower(d, _mode("peer"), 50.0),
          "peer_beats_no_peer"),
    Claim(f"The host link is the bottleneck (the course): a copy staged through pinned host "
          f"memory is at least {HOST_GAP:g}× slower than the direct peer copy",
          _host_is_bottleneck, lambda d: slower(d, _mode("host_staged"), 1 / 50.0),
          "host_is_bottleneck"),
    Claim(f"An NVLink pair's peer copy reaches the course's NVLink figure "
          f"({COURSE_NVLINK_GBPS:g} GB/s) in one direction", _nvlink_course,
          lambda d: slower(d, _nvlink_peer, 2.0), "nvlink_reaches_course"),
    Claim(f"Every pair's peer copy reaches at least {LARGE_FRACTION * 100:.0f} % of its link's "
          "theoretical bandwidth per direction (NVLink: links × the generation's GB/s per "
          "link; PCIe: the slower GPU's link, NVML)", _near_spec,
          lambda d: slower(d, _mode("peer"), 2.0), "near_link_spec"),
    Claim(f"Both directions at once move at least {BOTH_WAYS:g}× what one direction moves "
          "(the link is full duplex)", _both_ways,
          lambda d: slower(d, _mode("bidirectional"), 2.0), "both_ways_add_up"),
    Claim(f"A kernel reading the other GPU's memory directly reaches at least "
          f"{REMOTE_SHARE * 100:.0f} % of the copy engine's peer copy", _remote_read,
          lambda d: slower(d, _mode("remote_read"), 4.0), "remote_read_near_copy"),
)

LESSON = Lesson(
    title="Between GPUs: NVLink, PCIe and the host",
    caption=(
        "Every ordered pair of this machine's GPUs, five ways: a copy with peer access on "
        "(over NVLink where the GPUs have it, else PCIe peer-to-peer), the same copy with "
        "peer access off (the driver stages it through host memory), a copy staged by hand "
        "through pinned host memory, both directions at once, and a kernel on one GPU "
        "loading the other GPU's memory directly. The course gives NVLink 300 GB/s against "
        "PCIe 12–32 GB/s and calls the host link the biggest bottleneck: look for the gap "
        "between the direct copies and those that cross the host, for whether both "
        "directions add up, and for a pair slower than the others of its link type. "
        "Machines with one GPU have nothing to measure here: the claims say so."
    ),
    figures={"matrix": (
        "Bandwidth matrix per mode: source GPU rows, destination GPU columns, GB/s in each "
        "cell; grey cells were not measured (the diagonal, or no peer access). One colour "
        "scale for all panels, so the host's modes look dark beside the direct ones.")},
    claims=CLAIMS,
    try_this=[
        TryThis("interconnect.size_mib: 16", "smaller copies reach less of the link: the "
                "fixed cost of each copy weighs more, most in the host-staged mode"),
        TryThis("gpus: [0, 1]", "only that pair is measured (both directions); on a machine "
                "where some pairs cross sockets (SYS), listing them shows the slowest path"),
        TryThis("gpus: [0]", "one GPU for the whole run: nothing to measure between GPUs, "
                "and each claim of this lesson says not applicable, and why"),
    ],
    # measured: 0.81 A4 pages for the four-H200 run (reports/reference/multi-gpu-4xH200-*)
    print_pages=0.85,
    questions=[
        Question("With peer access off, the copy still arrives: which link does it cross, "
                 "and how often?", answers.peer_off_path),
        Question("The course's NVLink figure counts both directions of an older GPU's links: "
                 "what does one direction of this machine's link carry in theory, and how "
                 "close does the copy come?", answers.one_direction),
        Question("Why can a kernel that loads the other GPU's memory reach nearly the copy "
                 "engine's bandwidth, and what would it need to do so with fewer threads?",
                 answers.remote_read),
    ],
    sources={
        "300": "the course's NVLink figure (its multi-GPU slides); a V100's NVLink 2 "
               "carries 300 GB/s over both directions of its six links (NVIDIA V100 data "
               "sheet)",
        "25": "GB/s per NVLink link and direction in NVLink 2, 3 and 4 (NVIDIA's V100, A100 "
              "and H100 data sheets: NVLink bandwidth / links / 2)",
        "5": "NVLink 5, the generation of the B200, 50 GB/s per link and direction (NVIDIA "
             "B200 data sheet)",
        "12": "the course's lower PCIe figure (its multi-GPU slides): PCIe 3 x16 in "
              "practice",
    },
)
