"""Every factor a fitted what-if model applies, with what it rests on (:func:`scale_factors`):
the CLI prints them and the What-if page lists them, so no factor acts unseen.
"""
from __future__ import annotations

from dpcore.read.whatif.cells import Model

#: What a factor's value rests on, as ``scale_factors`` names it.
KINDS = ("measured", "fitted", "calibration", "given", "fabric", "assumed", "none")


def kind_of(source: str) -> str:
    """The kind (:data:`KINDS`) of a value from the sentence saying where it came from."""
    s = source.lower()
    if s.startswith(("unknown", "assumed", "unmeasured", "not fitted")) or "default" in s.split(":")[0]:
        return "assumed"
    if s.startswith("given"):
        return "given"
    if s.startswith("fabric"):
        return "fabric"
    if s.startswith("in-job"):
        return "measured"
    return "fitted"


def scale_factors(model: Model) -> list[tuple[str, str, str, str]]:
    """Every factor the replay applies: (name, value, kind from :data:`KINDS`, where it came
    from). The CLI prints them and the page lists them, so no factor acts unseen."""
    rows = [("kappa (compute slowed by comm in flight)", f"{model.kappa:.2f}", kind_of(model.kappa_source),
             model.kappa_source),
            ("alpha", f"{model.alpha_us:.1f} µs", kind_of(model.alpha_source),
             model.alpha_source),
            ("B", f"{model.bandwidth_gbps:.3f} GB/s", kind_of(model.bandwidth_source),
             model.bandwidth_source)]
    if len(model.network_by_ws) > 1:
        lines = "; ".join(f"{n} ranks {a:.1f} µs, {b:.3f} GB/s" for n, (a, b) in sorted(model.network_by_ws.items()))
        rows.append(("alpha and B per world size", lines, "fitted",
                     "allreduce.csv: a cell at a world size it measured takes that line, others the one above"))
    if model.fabric is not None and model.network_given[0] is None:
        inter = model.fabric.inter
        rows.append((f"alpha between nodes ({inter.name})", f"{inter.alpha_us:g} µs",
                     "assumed" if model.fabric.inter_assumed else "fabric", inter.source))
        rows.append((f"B between nodes ({inter.name}; the ring takes the slower link)", f"{inter.busbw_gbps:g} GB/s",
                     "assumed" if model.fabric.inter_assumed else "fabric", inter.source))
    rows.append(("backward per bucket (staging, hook, launch)", f"{model.bucket_overhead_ms:.3f} ms",
                 kind_of(model.bucket_overhead_source), model.bucket_overhead_source))
    rows.append(("gradient ready times", f"{len(model.src.sizes)} gradients", "measured",
                 f"the source job's own backward ({model.src.grads_source})"))
    cal = model.calibration_source
    kind = "calibration" if cal.startswith("kappa_comm") else "none" if cal.startswith("none") else "assumed"
    rows.append(("kappa_comm (comm slowed by backward)", f"{model.kappa_comm:.2f}", kind, cal))
    rows.append(("all-reduce transfer time x", f"{model.comm_scale:.2f}", kind, cal))
    if model.strong:
        rows.append(("forward/backward x N_source/N", f"{model.src.world_size}/N", "assumed",
                     "strong scaling (fixed global batch): per-rank compute divides by the ranks"))
    if model.ranks_that_fit > 0:
        rows.append(("compute x max(1, N / ranks the cores hold) / the same at the source's N",
                     f"{model.ranks_that_fit:g} ranks fit", "assumed",
                     "run.json's cpu_cores / threads_per_rank: ranks beyond that share the cores evenly "
                     "(gloo's own threads left out)"))
    rows.append(("in-training cost per all-reduce the replay misses (x buckets, on the step)",
                 f"{model.message_ms:.3f} ms",
                 "none" if model.message_source.startswith("none") else kind_of(model.message_source),
                 model.message_source))
    rows.append(("bookkeeping after the last bucket", f"{model.tail_ms:.2f} ms", "measured",
                 "median over the source job's timed rank-steps"))
    anchored = not model.anchor_source.startswith("none")
    rows.append(("step x anchor (the CSV's unexplained_ms is what it adds)", f"x{model.anchor_ratio:.3f}",
                 "measured" if anchored else "none",
                 ("source's median step over the replay of its own plan: " if anchored else "")
                 + model.anchor_source))
    return rows
