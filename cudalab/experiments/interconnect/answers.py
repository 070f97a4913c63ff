"""The teacher's answers to the interconnect lesson's questions, computed from the run."""

from __future__ import annotations

import pandas as pd

from cudalab import fmt
from cudalab.experiments.questions import Answer, Run, cite, have, not_measured, num, pick

WOULD = "run the interconnect lesson on a machine with 2 or more GPUs"


def _pair(run: Run, *variants: str) -> list[pd.Series] | None:
    """The rows of `variants` for the first pair measured in all of them (GPU 0 -> 1 where
    it was), None where no pair has them all."""
    d = run.ok()
    if d.empty or "p_src" not in d:
        return None
    pairs = d[["p_src", "p_dst"]].dropna().drop_duplicates().itertuples(index=False)
    for src, dst in sorted(pairs):
        rows = [pick(d, v, src=src, dst=dst) for v in variants]
        if all(r is not None and have(r["gbps"]) for r in rows):
            return rows  # type: ignore[return-value]
    return None


def _label(r: pd.Series) -> str:
    return f"{r['variant']} GPU {int(num(r['p_src']))} -> {int(num(r['p_dst']))}"


def peer_off_path(run: Run) -> Answer:
    rows = _pair(run, "no_peer", "peer")
    if rows is None or not have(rows[0].get("m_host_pcie_gbps")):
        return not_measured("a copy between two GPUs with peer access off and on, with the "
                            "host link's speed", WOULD)
    off, on = rows
    host = num(off["m_host_pcie_gbps"])
    work = [cite(off, "gbps", fmt.bandwidth, _label(off)),
            cite(off, "m_host_pcie_gbps", fmt.bandwidth, _label(off)) + " (the GPU's PCIe "
            "link per direction, NVML)",
            f"{fmt.bandwidth(num(off['gbps']))} / {fmt.bandwidth(host)} = "
            f"{fmt.percent(num(off['gbps']) / host, fraction=True)} of one crossing's speed",
            cite(on, "gbps", fmt.bandwidth, _label(on)) + ": the same copy over the peer link"]
    return Answer("With peer access off the driver cannot write into the other GPU's memory, "
                  "so it stages the copy through pinned host memory: the bytes cross the "
                  "host link twice, GPU to host and host to GPU, in chunks, one after the "
                  f"other. In this run the copy moved {fmt.bandwidth(num(off['gbps']))}, "
                  f"against {fmt.bandwidth(host)} that one direction of the GPU's PCIe link "
                  f"carries in theory, and {fmt.bandwidth(num(on['gbps']))} over the peer "
                  f"link ({fmt.ratio(num(on['gbps']) / num(off['gbps']))} faster).", work,
                  {"no_peer_gbps": num(off["gbps"]), "share_of_host_link":
                   num(off["gbps"]) / host, "peer_over_off": num(on["gbps"]) / num(off["gbps"])})


def one_direction(run: Run) -> Answer:
    rows = _pair(run, "peer")
    if rows is None or not have(rows[0].get("m_path_spec_gbps")):
        return not_measured("a peer copy with its link's theoretical bandwidth", WOULD)
    (r,) = rows
    spec, got = num(r["m_path_spec_gbps"]), num(r["gbps"])
    link = str(r.get("m_link_label") or r.get("m_link") or "the link")
    work = [cite(r, "m_path_spec_gbps", fmt.bandwidth, _label(r)) + f" ({link}, one "
            "direction: links × the generation's GB/s per link and direction)",
            cite(r, "gbps", fmt.bandwidth, _label(r)),
            f"{fmt.bandwidth(got)} / {fmt.bandwidth(spec)} = "
            f"{fmt.percent(got / spec, fraction=True)}",
            "the course's 300 GB/s: a V100's 6 NVLink 2 links × 25 GB/s × 2 directions"]
    return Answer(f"One direction of this pair's link ({link}) carries "
                  f"{fmt.bandwidth(spec)} in theory; the peer copy moved "
                  f"{fmt.bandwidth(got)}, {fmt.percent(got / spec, fraction=True)} of it. "
                  "The course's 300 GB/s adds both directions of a V100's six links (150 "
                  "GB/s each way), so one direction here is "
                  f"{fmt.ratio(got / 150)} what one direction carried there.", work,
                  {"spec_gbps": spec, "share": got / spec})


def remote_read(run: Run) -> Answer:
    rows = _pair(run, "remote_read", "peer")
    if rows is None:
        return not_measured("a kernel reading the other GPU's memory beside the peer copy",
                            WOULD)
    rd, cp = rows
    share = num(rd["gbps"]) / num(cp["gbps"])
    work = [cite(rd, "gbps", fmt.bandwidth, _label(rd)), cite(cp, "gbps", fmt.bandwidth,
                                                              _label(cp)),
            f"{fmt.bandwidth(num(rd['gbps']))} / {fmt.bandwidth(num(cp['gbps']))} = "
            f"{fmt.ratio(share)}"]
    return Answer("With peer access on, the other GPU's memory is in this GPU's address "
                  "space: a load becomes a request over the link, and the link is kept full "
                  "when enough requests are in flight to cover its round trip (bandwidth × "
                  "latency bytes, Little's law), which a grid of many warps provides. In this "
                  f"run the kernel read {fmt.bandwidth(num(rd['gbps']))}, {fmt.ratio(share)} "
                  f"the copy engine's {fmt.bandwidth(num(cp['gbps']))}. With fewer threads "
                  "each would need more bytes in flight: wider loads (16 bytes a thread) and "
                  "several independent loads per thread before the first is used.", work,
                  {"read_over_copy": share})
