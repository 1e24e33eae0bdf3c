"""Command line: ``python -m dpcore {verify,profile,allreduce,analyze,summarize,stragglers,whatif,import}``.

Bad input never produces a traceback: :class:`UsageError` becomes ``error: <one line>`` and
exit status 2. The CLI computes nothing itself; it parses, validates and calls the write wing's
commands, or prints what ``dpcore.read.report`` returns (one module per read command, on the
analysis functions the dashboard calls too, so both show the same numbers).
"""
from __future__ import annotations

import argparse
import math
import os
import re
import signal
import sys
import threading

from dpcore.contract.config import (ALGOS, MODELS, OPTIMIZERS, SCALING, SIZES, VARIANTS, TrainConfig, check_timeout, parse_bucket_sweep, parse_delay,
                     parse_choices, parse_int_list, parse_size, check_model_name, is_model_spec)
from dpcore.contract.errors import UsageError
from dpcore.write.runtime.progress import MODES



class _Parser(argparse.ArgumentParser):
    """argparse that raises UsageError instead of printing usage + exiting."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


def _train_args(p: argparse.ArgumentParser, default_model: str) -> None:
    p.add_argument("--model", default=default_model,
                   help=f"one of {', '.join(MODELS)}, or MODULE:FUNCTION: your own model, "
                        "FUNCTION() in MODULE (found in the current directory or on PYTHONPATH) "
                        "returning a dpcore.Workload(model, make_batch, loss_fn)")
    p.add_argument("--size", default="tiny",
                   help=f"transformer size: {', '.join(SIZES)} (ignored for MODULE:FUNCTION)")
    p.add_argument("--width", type=int, default=512,
                   help="mlp hidden width (ignored for MODULE:FUNCTION)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="per-rank batch (weak scaling) or global batch (strong); default 32, "
                        "einsum 5120 (DESIGN's b), MODULE:FUNCTION its Workload.batch_size or 32")
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--optimizer", default="sgd", choices=OPTIMIZERS,
                   help="torch.optim class of every variant: sgd (default), adam, adamw. SGD keeps "
                        "no state, so ZeRO-1's saving (zero1, torch_zero1) only shows with adam/adamw")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--backend", default="auto", help="auto (nccl if enough GPUs, else gloo), gloo, nccl")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds before a hung job is killed and reported (default 300)")


def build_parser() -> argparse.ArgumentParser:
    ap = _Parser(prog="python -m dpcore", description="Profile data-parallel training variants.")
    sub = ap.add_subparsers(dest="command", required=True, parser_class=_Parser)

    v = sub.add_parser("verify", help="prove every variant trains exactly like single-process")
    _train_args(v, "toy")
    v.set_defaults(steps=5, batch_size=None, lr=None)  # None: the model's verify defaults
    v.add_argument("--world-size", type=int, default=2)
    v.add_argument("--variants", default="all")

    p = sub.add_parser("profile", help="profile variants x world sizes into a run directory")
    _train_args(p, "mlp")
    p.add_argument("--variants", default="all")
    p.add_argument("--world-sizes", default="1,2")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--scaling", default="weak", help="weak (fixed per-rank batch) or strong")
    p.add_argument("--bucket-mb", type=float, default=25.0)
    p.add_argument("--bucket-sweep", default="", help="e.g. 1,10,25,100")
    p.add_argument("--profile-steps", type=int, default=3)
    p.add_argument("--no-trace", action="store_true", help="skip the torch.profiler steps")
    p.add_argument("--out", default="profiles")
    p.add_argument("--name", default=None, help="label added to the generated run id")
    p.add_argument("--run-id", default=None, help="exact run directory name (must not exist)")
    p.add_argument("--progress", default="bar", help=f"one of {', '.join(MODES)}")
    p.add_argument("--no-pin", action="store_true",
                   help="do not pin each rank to its own CPUs (by default ranks are pinned where they fit)")
    p.add_argument("--inject-delay", default=None, metavar="RANK:MS",
                   help="rank RANK sleeps MS ms in its forward every step: what a straggler looks like")
    p.add_argument("--threads-per-rank", type=int, default=None,
                   help="torch threads of every rank of every job (default: physical cores // "
                        "largest world size, the same for all jobs so scaling compares like with like)")

    a = sub.add_parser("allreduce", help="all-reduce bandwidth benchmark (nccl-tests style)",
                       description="Time every all-reduce algorithm at every world size and message size "
                                   "(float32, sum) and check each result, like nccl-tests' #wrong; the table "
                                   "(repeats, median time, algbw, busbw = algbw * 2(N-1)/N, #wrong) is printed and "
                                   "written as a run that the dashboard's Bandwidth and Ring messages views open.")
    a.add_argument("--algos", default="native,ring,naive,central",
                   help=f"comma-separated algorithms, or all: {', '.join(ALGOS)} (native = the backend's own "
                        "dist.all_reduce; the others are dpcore's from-scratch ones) (default: all four)")
    a.add_argument("--world-sizes", default="2,4",
                   help="comma-separated numbers of ranks; one job per (algorithm, world size) (default 2,4)")
    a.add_argument("--sizes", default="1KB,64KB,1MB,16MB,64MB",
                   help="comma-separated message sizes in bytes, KB, MB or GB (binary: 1MB = 2^20 bytes), "
                        "each a multiple of 4 bytes (float32) (default 1KB,64KB,1MB,16MB,64MB)")
    a.add_argument("--warmup", type=int, default=3,
                   help="untimed all-reduce calls per size before the timed ones (default 3)")
    a.add_argument("--repeats", type=int, default=0,
                   help="timed calls per size; the table shows their median (default 0 = adaptive: 50 up to "
                        "64 KiB, 20 up to 4 MiB, 10 above)")
    a.add_argument("--backend", default="auto", help="auto (nccl if enough GPUs, else gloo), gloo, nccl")
    a.add_argument("--timeout", type=float, default=300.0,
                   help="seconds before a hung job is killed and reported (default 300)")
    a.add_argument("--out", default="profiles", help="folder the run directory is written into (default profiles)")
    a.add_argument("--name", default=None, help="label added to the generated run id")
    a.add_argument("--run-id", default=None, help="exact run directory name (must not exist)")
    a.add_argument("--progress", default="bar",
                   help=f"one of {', '.join(MODES)}: a terminal bar, JSON lines (for the dashboard), or nothing")

    z = sub.add_parser("analyze", help="overlap per rank of a run or a folder of traces")
    z.add_argument("path")
    z.add_argument("--csv", action="store_true")

    s = sub.add_parser("summarize", help="per-job table of a run")
    s.add_argument("run")
    s.add_argument("--csv", action="store_true")

    g = sub.add_parser("stragglers", help="which rank arrives last at the collectives, per job and rank")
    g.add_argument("path", help="a run directory, a job's traces folder, or any folder of torch.profiler traces")
    g.add_argument("--csv", action="store_true")

    w = sub.add_parser("whatif", help="predict a bucketed/torch_ddp job's step time at other buckets, "
                                      "world sizes and networks (trace-driven replay)")
    w.add_argument("run", help="a run directory with a bucketed or torch_ddp job")
    w.add_argument("--job", required=True, help="the measured job to start from, e.g. bucketed-ws2-b25")
    w.add_argument("--bucket-mb", default=None, help="bucket sizes in MB, e.g. 1,4,25 (default: the run's)")
    w.add_argument("--world-sizes", default=None, help="e.g. 1,2,8 (default: the run's)")
    w.add_argument("--bandwidth-gbps", type=float, default=None,
                   help="per-link bandwidth B in GB/s (default: fitted from an allreduce run or the job)")
    w.add_argument("--latency-us", type=float, default=None,
                   help="per-message latency alpha in us (default: fitted like B)")
    w.add_argument("--algo", default="ring", help="all-reduce algorithm of the alpha-beta model: "
                                                  "ring, native, central, naive (default ring)")
    w.add_argument("--allreduce-run", default=None,
                   help="fit alpha and B from this `allreduce` run (default: the run's own allreduce rows, "
                        "else the job's collectives)")
    w.add_argument("--csv", action="store_true")

    i = sub.add_parser("import", help="turn a folder of torch.profiler traces into a run directory")
    i.add_argument("traces", help="a folder of traces (searched recursively: rank<r>.json, *.pt.trace.json[.gz], "
                                  "torchtitan's iteration_<k>/rank<r>_trace.json) or one trace file")
    i.add_argument("--out", default="profiles")
    i.add_argument("--name", default=None, help="label added to the generated run id")
    i.add_argument("--iteration", type=int, default=None,
                   help="torchtitan layout: which iteration_<k> folder (default: the latest)")
    i.add_argument("--align-clocks", default="auto", choices=("auto", "always", "never"),
                   help="shift ranks onto rank 0's clock by matched collective ends (auto: only when "
                        "the traces come from several hosts)")
    return ap


def _check_model(args: argparse.Namespace, extra: tuple[str, ...] = (),
                 world_sizes: "tuple[int, ...] | list[int]" = (1,)) -> "object | None":
    """Validate --model; for MODULE:FUNCTION load the workload here, once, in this process
    (import, FUNCTION(), a 2 x world-size batch, one forward + loss), so every mistake is one
    line and exit 2 before any rank starts or any run directory exists. Returns the workload
    (None for a built-in model)."""
    check_model_name(args.model, extra)
    if is_model_spec(args.model):
        from dpcore.write.training.workload import check_workload

        return check_workload(args.model, args.seed, world_sizes)
    if args.model == "transformer":
        parse_choices(args.size, "size", SIZES, all_ok=False)
    return None


def _check_int(option: str, value: "int | None", minimum: int, note: str = "") -> None:
    """An integer option below its minimum is one line naming the option and the range."""
    if value is not None and value < minimum:
        raise UsageError(f"{option} must be >= {minimum}{note}, got {value}")


def _check_train_args(args: argparse.Namespace) -> None:
    """The numbers shared by ``profile`` and ``verify``, refused before anything is imported or
    run: a zero or negative --timeout makes every rendezvous fail at once with pages of c10d
    frames, nan/inf overflow it, --width 0 builds an empty model and --lr nan trains to nan,
    and both were recorded as complete runs."""
    check_timeout(args.timeout)
    _check_int("--width", args.width, 1)
    _check_int("--batch-size", args.batch_size, 1)
    if args.lr is not None and not (math.isfinite(args.lr) and args.lr >= 0):
        raise UsageError(f"--lr must be a finite number >= 0, got {args.lr:g}")


def _check_out(out: str) -> None:
    """--out must be (or be creatable as) a writable folder. Checked here, before any rank
    starts, so a file in the way or a read-only folder is one line and exit 2, not an OSError
    reported as if measured jobs had been kept. The nearest existing ancestor decides."""
    path = os.path.abspath(out)
    probe = path
    while not os.path.exists(probe):
        parent = os.path.dirname(probe)
        if parent == probe:
            break
        probe = parent
    if not os.path.isdir(probe):
        raise UsageError(f"--out {out}: not a folder (a file is in the way); choose a writable folder")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise UsageError(f"--out {out}: {probe} is not writable; choose a writable folder")


def _run_id(text: str | None) -> str | None:
    """Run ids become folder names under --out: letters, digits, '-', '_' and '.' only."""
    if text is not None and not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}", text):
        raise UsageError(f"bad --run-id {text!r}; use letters, digits, '-', '_' and '.' "
                         "(no slashes), e.g. my-run-1")
    return text


def _cmd_verify(args: argparse.Namespace) -> int:
    check_model_name(args.model, ("toy",))
    _check_train_args(args)
    if args.world_size < 1:
        raise UsageError(f"--world-size must be >= 1, got {args.world_size}")
    if args.steps < 1:
        raise UsageError(f"--steps must be >= 1, got {args.steps}")
    variants = parse_choices(args.variants, "variant", VARIANTS)
    workload = _check_model(args, ("toy",), (args.world_size,))
    from dpcore.write.commands.verify import format_table, run_verify, spec_bucket_mb, verify_config

    given = {k: getattr(args, k) for k in ("batch_size", "lr") if getattr(args, k) is not None}
    if workload is not None:  # already loaded: size the buckets from it, no second FUNCTION()
        given["bucket_mb"] = spec_bucket_mb(workload.model)  # type: ignore[attr-defined]
    cfg = verify_config(args.model, args.steps, size=args.size, width=args.width, seed=args.seed,
                        optimizer=args.optimizer, **given)
    rows, ok = run_verify(args.world_size, model=args.model, steps=args.steps, variants=variants,
                          backend=args.backend, timeout_s=args.timeout, cfg=cfg)
    print(format_table(rows))
    return 0 if ok else 1


def _cmd_profile(args: argparse.Namespace, argv: list[str]) -> int:
    from dpcore.write.commands.profile import ProfileOptions, run_profile

    check_model_name(args.model)
    _check_train_args(args)
    parse_choices(args.scaling, "scaling mode", SCALING, all_ok=False)
    parse_choices(args.progress, "progress mode", MODES, all_ok=False)
    sweep = parse_bucket_sweep(args.bucket_sweep)
    if not (math.isfinite(args.bucket_mb) and args.bucket_mb > 0):
        raise UsageError(f"--bucket-mb must be a positive number of MB, got {args.bucket_mb}")
    opts = ProfileOptions(
        variants=tuple(parse_choices(args.variants, "variant", VARIANTS)),
        world_sizes=tuple(parse_int_list(args.world_sizes, "world sizes")), bucket_sweep=sweep,
        trace=not args.no_trace, out=args.out, name=args.name, backend=args.backend,
        timeout_s=args.timeout, progress=args.progress, run_id=_run_id(args.run_id),
        threads_per_rank=args.threads_per_rank, pin=not args.no_pin)
    workload = _check_model(args, (), opts.world_sizes)
    if args.batch_size is None and workload is not None:
        args.batch_size = getattr(workload, "batch_size", None) or 32
    elif args.batch_size is None:
        from dpcore.write.training.models import default_batch_size
        args.batch_size = default_batch_size(args.model) or 32
    delay = (parse_delay(args.inject_delay, max(opts.world_sizes)) if args.inject_delay is not None
             else (-1, 0.0))
    cfg = TrainConfig(model=args.model, size=args.size, width=args.width,
                      delay_rank=delay[0], delay_ms=delay[1],
                      batch_size=args.batch_size, scaling=args.scaling, steps=args.steps,
                      warmup=args.warmup, profile_steps=0 if args.no_trace else args.profile_steps,
                      bucket_mb=args.bucket_mb, lr=args.lr, seed=args.seed,
                      optimizer=args.optimizer)
    _check_out(args.out)
    code, run_dir = run_profile(opts, cfg, argv)
    if run_dir is not None and opts.progress != "json":
        _print_run_end(run_dir, code)
    return code


def _print_run_end(run_dir: "os.PathLike[str] | str", code: int) -> None:
    """The end-of-run table (the dashboard's numbers: the same analysis functions) and status."""
    from dpcore.read.report.summarize import run_end_table

    table, failed = run_end_table(str(run_dir))
    print(table)
    status = {0: "complete", 130: "interrupted"}.get(code, "failed")
    print(f"\nrun {status}: {run_dir}" + (f" ({failed} job(s) failed; see run.json)" if failed else ""),
          file=sys.stderr)


def _allreduce_sizes(text: str) -> tuple[int, ...]:
    """Message sizes in bytes; each must hold a whole number of float32 values (>= 4 bytes)."""
    sizes = tuple(dict.fromkeys(parse_size(s) for s in text.split(",") if s.strip()))
    bad = [s for s in sizes if s < 4 or s % 4]
    if bad:
        raise UsageError(f"--sizes must be multiples of 4 bytes (float32 elements), got "
                         f"{', '.join(map(str, bad))}; e.g. 1KB,64KB,1MB")
    return sizes


def _cmd_allreduce(args: argparse.Namespace, argv: list[str]) -> int:
    from dpcore.write.commands.allreduce import AllreduceOptions, run_allreduce

    parse_choices(args.progress, "progress mode", MODES, all_ok=False)
    check_timeout(args.timeout)
    _check_int("--warmup", args.warmup, 0)
    _check_int("--repeats", args.repeats, 0, " (0 = adaptive)")
    opts = AllreduceOptions(
        algos=tuple(parse_choices(args.algos, "algorithm", ALGOS)),
        world_sizes=tuple(parse_int_list(args.world_sizes, "world sizes")),
        sizes=_allreduce_sizes(args.sizes),
        warmup=args.warmup, repeats=args.repeats, out=args.out, name=args.name,
        backend=args.backend, timeout_s=args.timeout, progress=args.progress,
        run_id=_run_id(args.run_id))
    if not opts.sizes:
        raise UsageError("--sizes is empty; give sizes like 1KB,64KB,1MB")
    _check_out(args.out)
    code, run_dir = run_allreduce(opts, argv)
    if opts.progress != "json":  # the table through the read wing: the numbers `summarize` prints
        from dpcore.read.report.allreduce import allreduce_text
        print(allreduce_text(run_dir), end="")
        status = {0: "complete", 130: "interrupted"}.get(code, "failed")
        print(f"\nrun {status}: {run_dir}", file=sys.stderr)
    return code


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    """SIGTERM (the dashboard's Stop button, a job scheduler) ends a run like Ctrl-C does:
    finished jobs are kept, the run is marked interrupted and no rank is left behind."""
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        args = build_parser().parse_args(argv)
        if args.command == "verify":
            return _cmd_verify(args)
        if args.command == "profile":
            return _cmd_profile(args, ["python", "-m", "dpcore", *argv])
        if args.command == "allreduce":
            return _cmd_allreduce(args, ["python", "-m", "dpcore", *argv])
        if args.command == "import":
            from dpcore.read.importer.write_run import import_traces
            from dpcore.read.report.importer import import_text
            print(import_text(import_traces(args.traces, args.out, args.name, iteration=args.iteration,
                                            align=args.align_clocks, command=["python", "-m", "dpcore", *argv])))
            return 0
        from dpcore.read.report.analyze import analyze
        from dpcore.read.report.summarize import summarize
        from dpcore.read.rundir.load import RunLoadError
        try:
            if args.command == "stragglers":
                from dpcore.read.report.stragglers import stragglers_text
                out = stragglers_text(args.path, csv=args.csv).rstrip("\n")
            elif args.command == "whatif":
                from dpcore.read.report.whatif import whatif_text
                out = whatif_text(args.run, args.job, args.bucket_mb, args.world_sizes, args.bandwidth_gbps,
                                  args.latency_us, args.algo, args.csv, args.allreduce_run)
                out = out if args.csv else out.rstrip("\n")
            else:
                out = (analyze(args.path, csv=args.csv) if args.command == "analyze"
                       else summarize(args.run, csv=args.csv))
            print(out, end="" if args.csv else "\n")
        except (RunLoadError, OSError, ValueError) as exc:
            raise UsageError(str(exc).splitlines()[0] if str(exc) else type(exc).__name__) from None
        return 0
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `... | head`: the reader has all it wanted
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback (DPCORE_DEBUG=1 for it)
        if os.environ.get("DPCORE_DEBUG"):
            raise
        msg = str(exc).strip().splitlines()
        print(f"error: {type(exc).__name__}: {msg[0] if msg else ''} (set DPCORE_DEBUG=1 for the "
              "traceback; measured jobs were kept in the run directory)", file=sys.stderr)
        return 1
