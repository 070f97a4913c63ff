"""What the interconnect lesson knows about a link before measuring it: its kind (NVLink or a
PCIe path, from `nvidia-smi topo -m`), its theoretical bandwidth per direction, and the
rows of the run's table as cudalab.links' frame (for its figure and the claims)."""

from __future__ import annotations

import html
import math
import re
from typing import Any

import pandas as pd

from cudalab import links

# NVLink GB/s per link and direction, by the GPU's compute capability major (the generation
# the chip carries): NVLink 1 (P100, 6.0) 20; NVLink 2 (V100, 7.0), 3 (A100, 8.0) and 4
# (H100/H200, 9.0) 25; NVLink 5 (B200, 10.0) 50 (NVIDIA's data sheets: NVLink bandwidth
# per GPU / links per GPU / 2 directions).
NVLINK_LINK_GBPS = {6: 20.0, 7: 25.0, 8: 25.0, 9: 25.0, 10: 50.0}


def bus(pci_bus_id: str) -> str:
    """A PCI bus id without its domain, lower case: pycuda and NVML write the domain with
    4 and 8 digits."""
    return pci_bus_id.lower().split(":", 1)[-1] if pci_bus_id else ""


def kind(link: str) -> str:
    """NVLink, PCIe or unknown, from the topology's cell (NV<n>; PIX, PXB, PHB, NODE, SYS)."""
    link = link if isinstance(link, str) else ""  # a missing cell (NaN, NA)
    if re.fullmatch(r"NV\d+", link or ""):
        return "NVLink"
    return "PCIe" if link in ("PIX", "PXB", "PHB", "NODE", "SYS") else "unknown"


def nvlink_gbps(link: str, cc: str) -> float:
    """Theoretical NVLink GB/s per direction of this pair: links x GB/s per link (NaN where
    the link is no NVLink or the generation is unknown)."""
    m = re.fullmatch(r"NV(\d+)", link or "")
    try:
        major = int(str(cc).split(".")[0])
    except ValueError:
        return math.nan
    if not m or major not in NVLINK_LINK_GBPS:
        return math.nan
    return int(m.group(1)) * NVLINK_LINK_GBPS[major]


def pcie_of(index: int, pci_bus_id: str) -> float:
    """The GPU's PCIe link at its maximum generation and width, GB/s per direction (NaN
    where NVML cannot tell)."""
    from cudalab.experiments.transfer import pcie_gbps
    from cudalab.nvml_clocks import NvmlClockObserver

    facts = NvmlClockObserver(index, pci_bus_id=pci_bus_id).device_facts()
    return pcie_gbps(facts.get("pcie_gen_max"), facts.get("pcie_width_max"))


def metrics(link: str, cc: str, mode: str, peer_ok: bool, pcie: list[float | None]
            ) -> dict[str, Any]:
    """A point's metrics: the pair's link, its kind, and the theoretical GB/s of the path the
    mode takes (per direction; both directions for bidirectional). The host path (peer
    access off, staged) is bounded by the slower GPU's PCIe link; a staged copy crosses it
    twice, one after the other, so half of it."""
    host = min((p for p in pcie if p is not None and math.isfinite(p)), default=math.nan)
    k = kind(link)
    direct = nvlink_gbps(link, cc) if k == "NVLink" else host
    path = {"peer": direct, "remote_read": direct, "bidirectional": 2 * direct,
            "no_peer": host, "host_staged": host / 2}.get(mode, math.nan)
    return {"link": link or "unknown", "link_kind": k, "link_label": links.link_label(link),
            "peer_access": bool(peer_ok), "host_pcie_gbps": host, "path_spec_gbps": path}


def links_frame(df: pd.DataFrame) -> pd.DataFrame:
    """The run's measured pair rows as cudalab.links' frame: src, dst, mode, bytes, gbps,
    link, link_kind, spec (GB/s of the path), status."""
    cols = ["src", "dst", "mode", "bytes", "gbps", "link", "link_kind", "spec", "status"]
    if df.empty or "p_src" not in df:
        return pd.DataFrame(columns=cols)
    d = df[df["variant"].astype(str) != "topology"]
    d = d[d["status"].astype(str).isin(["ok", "skipped", "wrong"])]
    num = lambda c: pd.to_numeric(d[c], errors="coerce") if c in d else math.nan  # noqa: E731
    out = pd.DataFrame({
        "src": num("p_src").astype("Int64"), "dst": num("p_dst").astype("Int64"),
        "mode": d["variant"].astype(str), "bytes": num("p_size"),
        "gbps": num("gbps").where(d["status"].astype(str) == "ok"),
        "link": d["m_link"].astype(str) if "m_link" in d else "unknown",
        "link_kind": d["m_link_kind"].astype(str) if "m_link_kind" in d else "unknown",
        "spec": num("m_path_spec_gbps"), "status": d["status"].astype(str)})
    if "m_link_kind" not in d and "m_link" in d:
        out["link_kind"] = out["link"].map(kind)
    return out.reset_index(drop=True)


def topology_row(df: pd.DataFrame) -> pd.Series | None:
    rows = df[(df["variant"].astype(str) == "topology") & (df["status"].astype(str) == "ok")]
    return rows.iloc[-1] if len(rows) else None


def tables(df: pd.DataFrame) -> list[dict[str, str]]:
    """The pairs' links (kind, spec) and nvidia-smi topo -m as printed."""
    out = []
    d = links_frame(df)
    if not d.empty:
        peer = d[d["mode"] == "peer"].drop_duplicates(["src", "dst"])
        body = "".join(
            f"<tr><td>GPU {r.src} &rarr; GPU {r.dst}</td><td>{html.escape(r.link)}</td>"
            f"<td>{html.escape(links.link_label(r.link))}</td>"
            f"<td>{'' if pd.isna(r.spec) else f'{r.spec:.0f} GB/s'}</td>"
            f"<td>{'yes' if r.status != 'skipped' else 'no'}</td></tr>"
            for r in peer.itertuples())
        out.append({"title": "The link of each pair (nvidia-smi topo -m)", "html":
                    "<table><thead><tr><th>pair</th><th>link</th><th>kind</th><th>theoretical"
                    " per direction</th><th>peer access</th></tr></thead>"
                    f"<tbody>{body}</tbody></table>"})
    topo = topology_row(df)
    text = str(topo.get("m_nvidia_smi_topo", "")) if topo is not None else ""
    if text and text != "nan":
        out.append({"title": "nvidia-smi topo -m", "html": f"<pre>{html.escape(text)}</pre>"})
    return out
