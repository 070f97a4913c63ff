"""The links between GPUs: the topology as nvidia-smi prints it, the slow-pair rule, and the
acceptance page's links section. The copies themselves run on a machine of 2+ GPUs
(`python -m cudalab.links`, run by `cudalab accept`; reports/reference/)."""

from __future__ import annotations

import math

import pandas as pd
from test_accept import GPUS, run_of

from cudalab import accept, links

TOPO = """\
\t\x1b[4mGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m
GPU0\t X \tNV18\tNV18\tSYS\tSYS\t0-47\t0\t\tN/A
GPU1\tNV18\t X \tNV18\tSYS\tSYS\t0-47\t0\t\tN/A
GPU2\tNV18\tNV18\t X \tSYS\tSYS\t48-95\t1\t\tN/A
GPU3\tSYS\tSYS\tSYS\t X \tPIX\t48-95\t1\t\tN/A
NIC0\tSYS\tSYS\tSYS\tPIX\t X

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes
"""


def test_topology_reads_each_pairs_link():
    topo = links.topology(TOPO)
    assert topo[(0, 1)] == "NV18" and topo[(1, 0)] == "NV18"
    assert topo[(0, 3)] == "SYS" and topo[(3, 2)] == "SYS"
    assert (0, 0) not in topo and len(topo) == 12
    assert links.link_label("NV18") == "NVLink (18 links)"
    assert links.link_label("SYS").startswith("PCIe across sockets")


def frame(gbps: dict[tuple[int, int], float], link: str = "NV18") -> pd.DataFrame:
    rows = []
    for (s, d), g in gbps.items():
        for mode, v in (("peer", g), ("no_peer", g / 10), ("host_staged", g / 12)):
            rows.append({"src": s, "dst": d, "mode": mode, "bytes": 1 << 28,
                         "seconds": (1 << 28) / v / 1e9, "gbps": v, "correct": True,
                         "note": math.nan, "link": link})
    return pd.DataFrame(rows)


def test_a_pair_below_80_percent_of_its_link_types_median_is_slow():
    df = frame({(0, 1): 380.0, (1, 0): 384.0, (0, 2): 376.0, (2, 0): 250.0})
    slow = links.slow_pairs(df)
    assert [(r.src, r.dst) for r in slow.itertuples()] == [(2, 0)]
    assert links.slow_pairs(frame({(0, 1): 380.0, (1, 0): 350.0})).empty


def test_pairs_are_judged_within_their_link_type():
    df = pd.concat([frame({(0, 1): 380.0, (1, 0): 381.0}),
                    frame({(0, 3): 40.0, (3, 0): 41.0}, link="SYS")])
    assert links.slow_pairs(df).empty, "a PCIe pair is not slow beside NVLink ones"


def test_the_page_has_the_matrix_the_course_numbers_and_the_slow_pair(tmp_path):
    runs = {i: run_of(i, {"p0": 1e-3, "p1": 2e-3}) for i in range(3)}
    table, _ = accept.judge(runs)
    out = accept.verdicts(table, GPUS, {}, {}, {i: tmp_path for i in range(3)})
    df = frame({(0, 1): 380.0, (1, 0): 384.0, (0, 2): 376.0, (2, 0): 250.0})
    accept.write_page(out, tmp_path / "accept.html", "node", 5.0, df)
    page = (tmp_path / "accept.html").read_text()
    assert "data:image/png;base64," in page
    assert "NVLink (18 links): copy, peer access on 378 GB/s; copy, peer access off 38 GB/s" in page
    assert "the course: NVLink: 300 GB/s" in page
    assert "GPU 2 &rarr; GPU 0" in page and "1 GPU pair(s) copy slower" in page


def test_eight_gpus_and_nics_with_the_header_uncoloured():
    """nvidia-smi topo -m of an 8-GPU node as topology_text() keeps it (colour codes gone):
    the header's GPU names are no row, and the NIC and affinity columns no GPU."""
    gpus = [f"GPU{i}" for i in range(8)]
    head = "\t" + "\t".join(gpus + ["NIC0", "NIC1", "CPU Affinity", "NUMA Affinity"])
    rows = [f"GPU{i}\t" + "\t".join(" X " if j == i else ("NV18" if j // 4 == i // 4 else
                                                           "SYS") for j in range(8))
            + "\tPXB\tSYS\t0-47\t0" for i in range(8)]
    topo = links.topology("\n".join([head, *rows, "NIC0\tPXB\tX", "", "Legend:"]))
    assert len(topo) == 56 and max(max(k) for k in topo) == 7
    assert topo[(0, 3)] == "NV18" and topo[(3, 4)] == "SYS" and topo[(7, 6)] == "NV18"
