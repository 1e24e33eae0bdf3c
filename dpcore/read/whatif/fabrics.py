"""Interconnect presets for the what-if (docs/DESIGN.md, "What-if fabrics"): one table file,
``fabrics.csv``, with columns ``name, scope (intra|inter), devices, algorithm, busbw_gbps,
alpha_us, source``. ``busbw_gbps`` is nccl-tests' bus bandwidth of a large all-reduce, so it is
the ``B`` of the ring formula ``2(N-1)/N · S/B`` whatever algorithm reached it (busbw is defined
through that factor); ``alpha_us`` is the latency of one ring step.

**Several nodes: a flat ring bounded by the link between nodes** (the shape of NCCL's own cost
model, NVIDIA/nccl ``src/graph/tuning.cc``). ``N`` ranks fill nodes of ``devices`` GPUs,
``nodes = ceil(N / devices)``. One ring over all ranks takes ``2(N-1)`` steps, of which
``2(nodes-1)`` cross a node boundary (``alpha_inter`` each) and the rest stay inside the node
(``alpha_intra``). Every step moves ``S/N`` bytes over every link of the ring at once, so the
slowest link sets the pace: ``B = min(B_intra, B_inter)``, where ``B_inter`` is the node's NICs
together (NCCL runs one ring channel per NIC):

    t = 2(N - nodes)·alpha_intra + 2(nodes - 1)·alpha_inter + 2(N-1)/N · S / min(B_intra, B_inter)

A hierarchical all-reduce (reduce-scatter inside, all-reduce between, all-gather inside) moves
fewer bytes between nodes; the flat ring is the conservative bound and what NCCL's ring does.
"""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

from dpcore.contract.errors import UsageError, choices_error

FABRICS_CSV = Path(__file__).with_name("fabrics.csv")
FABRIC_COLUMNS = ["name", "scope", "devices", "algorithm", "busbw_gbps", "alpha_us", "source"]
#: The link between nodes when ``--fabric`` names only the one inside a node and the world size
#: needs several nodes: an InfiniBand NDR rail per GPU, the layout of the 8-GPU H100/H200 nodes
#: the intra presets describe. Printed as assumed wherever it is used.
DEFAULT_INTER = "ib-ndr400"


@dataclass(frozen=True)
class Fabric:
    """One row of the table."""

    name: str
    scope: str
    devices: int
    algorithm: str
    busbw_gbps: float
    alpha_us: float
    source: str


def load_fabrics(path: Path = FABRICS_CSV) -> dict[str, Fabric]:
    """The table by name, in file order."""
    with open(path, newline="") as fh:
        rows = list(csv.DictReader(fh))
    return {r["name"]: Fabric(r["name"], r["scope"], int(r["devices"]), r["algorithm"], float(r["busbw_gbps"]),
                              float(r["alpha_us"]), r["source"]) for r in rows}


@dataclass(frozen=True)
class Network:
    """What ``--fabric`` names: the link inside a node and the one between nodes."""

    intra: Fabric
    inter: Fabric
    inter_assumed: bool

    @property
    def label(self) -> str:
        inter = f"{self.inter.name} (assumed)" if self.inter_assumed else self.inter.name
        return f"{self.intra.name} inside a node, {inter} between nodes"


def parse_fabric(text: str, table: dict[str, Fabric] | None = None) -> Network:
    """``NAME`` (a link inside a node) or ``INTRA,INTER``; UsageError naming the valid names."""
    table = load_fabrics() if table is None else table
    names = [t.strip() for t in text.split(",")]
    for n in names:
        if n not in table:
            raise choices_error("fabric", n, [*table, "list"])
    intra = [table[n] for n in names if table[n].scope == "intra"]
    inter = [table[n] for n in names if table[n].scope == "inter"]
    if len(names) > 2 or len(intra) != 1 or len(inter) > 1:
        valid_intra = ", ".join(n for n, f in table.items() if f.scope == "intra")
        valid_inter = ", ".join(n for n, f in table.items() if f.scope == "inter")
        raise UsageError(f"--fabric {text!r}: name one link inside a node ({valid_intra}), optionally followed "
                         f"by one between nodes ({valid_inter}), e.g. nvlink-h100,ib-ndr400")
    return Network(intra[0], inter[0] if inter else table[DEFAULT_INTER], not inter)


def ring_parts(net: Network, n: int, nbytes: float, alpha_us: float | None = None,
               bandwidth_gbps: float | None = None) -> tuple[float, float, float, float]:
    """(latency ms, transfer ms, the bottleneck B in GB/s, the mean α per step in µs) of one
    all-reduce of ``nbytes`` over ``n`` ranks (module docstring). ``alpha_us`` /
    ``bandwidth_gbps``: the user's values, replacing every step's α / the bottleneck B."""
    nodes = max(math.ceil(n / max(net.intra.devices, 1)), 1)
    b = min(net.intra.busbw_gbps, net.inter.busbw_gbps) if nodes > 1 else net.intra.busbw_gbps
    b = b if bandwidth_gbps is None else bandwidth_gbps
    if n <= 1 or nbytes <= 0:
        return 0.0, 0.0, b, 0.0
    inter_steps = 2 * (nodes - 1)
    intra_steps = 2 * (n - 1) - inter_steps
    if alpha_us is None:
        lat_us = intra_steps * net.intra.alpha_us + inter_steps * net.inter.alpha_us
    else:
        lat_us = 2 * (n - 1) * alpha_us
    return lat_us / 1e3, 2 * (n - 1) / n * nbytes / (b * 1e9) * 1e3, b, lat_us / (2 * (n - 1))


def fabrics_text(table: dict[str, Fabric] | None = None) -> str:
    """``whatif --fabric list``: the table, one fabric per block, with its source."""
    table = load_fabrics() if table is None else table
    lines = ["fabrics (busbw: nccl-tests' bus bandwidth of a large all-reduce; alpha: latency per ring step):"]
    for f in table.values():
        lines.append(f"  {f.name:<18} {f.scope:<5} {f.devices} devices  {f.algorithm:<4} "
                     f"busbw {f.busbw_gbps:g} GB/s  alpha {f.alpha_us:g} µs")
        lines.append(f"      source: {f.source}")
    lines.append("use: --fabric INTRA or --fabric INTRA,INTER (several nodes: a flat ring bounded by the slower "
                 f"link; INTER defaults to {DEFAULT_INTER}, said so)")
    return "\n".join(lines) + "\n"
