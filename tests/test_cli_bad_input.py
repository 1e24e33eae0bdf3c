"""Bad input: one clear line naming the problem and the valid choices, exit 2, no traceback."""
from __future__ import annotations

import subprocess
import sys

import pytest

from dpcore.cli import main
from dpcore.contract.config import parse_size

CASES = [
    (["profile", "--variants", "nope"], "unknown variant nope; valid choices: single, manual"),
    (["profile", "--model", "resnet"],
     "--model must be one of mlp, transformer, einsum or MODULE:FUNCTION, got 'resnet'"),
    (["profile", "--model", "transformer", "--size", "huge"], "valid choices: tiny, small, medium"),
    (["profile", "--world-sizes", "0"], "world sizes must be integers >= 1"),
    (["profile", "--world-sizes", "a,b"], "bad world sizes 'a,b'"),
    (["profile", "--steps", "0"], "--steps must be >= 1"),
    (["profile", "--steps", "2", "--profile-steps", "3"], "--profile-steps must be between 1 and --steps (2)"),
    (["profile", "--scaling", "strong", "--batch-size", "7", "--world-sizes", "1,2"],
     "global batch 7 is not divisible by world size 2"),
    (["profile", "--scaling", "diagonal"], "unknown scaling mode diagonal; valid choices: weak, strong"),
    (["profile", "--backend", "nccl", "--variants", "flat"], "backend nccl needs"),
    (["profile", "--backend", "mpi", "--variants", "flat"], "valid choices: auto, gloo, nccl"),
    (["allreduce", "--algos", "tree"], "unknown algorithm tree; valid choices: native, ring, naive, central"),
    (["allreduce", "--sizes", "12XB"], "bad size '12XB'"),
    (["verify", "--world-size", "0"], "--world-size must be >= 1"),
    (["verify", "--variants", "ddp"], "unknown variant ddp"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
    (["profile", "--inject-hang", "1"], "bad --inject-hang '1'; use RANK:STEP"),
    (["profile", "--inject-hang", "1:2:nap"], "bad --inject-hang '1:2:nap'"),
    (["profile", "--inject-hang", "5:1", "--world-sizes", "1,2"],
     "--inject-hang rank 5 does not exist; valid ranks: 0..1"),
    (["profile", "--inject-hang", "1:9", "--steps", "5"],
     "--inject-hang step 9 is not a timed step; valid steps: 0..4"),
    (["profile", "--hang-timeout", "0"], "--hang-timeout must be a number of seconds > 0"),
    (["profile", "--hang-timeout", "50", "--timeout", "40"], "--hang-timeout (50 s) must be below --timeout (40 s)"),
    (["hang", "/nonexistent/dpcore-dumps"], "no such file or directory"),
    (["profile", "--device", "tpu"], "unknown device tpu; valid choices: auto, cpu, cuda"),
    (["allreduce", "--device", "gpu"], "unknown device gpu; valid choices: auto, cpu, cuda"),
    (["verify", "--device", "xpu"], "unknown device xpu; valid choices: auto, cpu, cuda"),
    (["profile", "--dtype", "bf8"], "unknown dtype bf8; valid choices: auto, fp32, bf16, fp16"),
    (["verify", "--dtype", "int8"], "unknown dtype int8; valid choices: auto, fp32, bf16, fp16"),
    (["profile", "--device", "cpu", "--backend", "nccl", "--variants", "flat"], "backend nccl needs GPUs"),
]


@pytest.mark.parametrize("argv,needle", CASES)
def test_bad_input_is_one_line_exit_2(argv, needle, capsys, tmp_path):
    rc = main([*argv, *(["--out", str(tmp_path)] if argv[0] in ("profile", "allreduce") else [])])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("error: ") and needle in err, err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not list(tmp_path.iterdir())  # refused before anything ran or was written


def test_bad_input_through_the_real_entry_point(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dpcore", "profile", "--variants", "bogus"],
                          capture_output=True, text=True, timeout=60, cwd=tmp_path,
                          env={"PYTHONPATH": str(__import__("pathlib").Path(__file__).parents[1]),
                               "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: unknown variant bogus; valid choices: single, manual, naive, flat, central, ring, "
        "overlap, bucketed, torch_ddp, data_parallel, zero1, torch_zero1, fsdp, torch_fsdp or all"]


def test_analyze_missing_path_is_one_line(capsys, tmp_path):
    rc = main(["analyze", str(tmp_path / "nowhere")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and err.count("\n") == 1


@pytest.mark.parametrize("text,value", [("1KB", 1024), ("64KB", 65536), ("1MB", 2**20),
                                        ("16M", 16 * 2**20), ("100", 100), ("1.5KB", 1536)])
def test_parse_size(text, value):
    assert parse_size(text) == value


@pytest.mark.parametrize("bad", ["../escape", "a/b", ".hidden", ""])
def test_run_id_cannot_leave_the_profiles_folder(bad, capsys, tmp_path):
    rc = main(["profile", "--run-id", bad, "--out", str(tmp_path)])
    assert rc == 2 and "bad --run-id" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("sweep", ["abc", "nan", "inf", "-1", "0", "1,x", "1e30"])
def test_bad_bucket_sweep_is_one_line(sweep, capsys, tmp_path):
    rc = main(["profile", "--bucket-sweep", sweep, "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2 and "bad --bucket-sweep value" in err and err.count("\n") == 1
    assert not list(tmp_path.iterdir())


def test_allreduce_sizes_must_be_whole_float32(capsys, tmp_path):
    rc = main(["allreduce", "--sizes", "1KB,3", "--out", str(tmp_path)])
    assert rc == 2 and "multiples of 4 bytes" in capsys.readouterr().err


def test_repeated_world_sizes_and_variants_run_once():
    from dpcore.contract.config import TrainConfig, parse_choices, parse_int_list
    from dpcore.contract.options import ProfileOptions
    from dpcore.write.commands.profile import plan_jobs
    ws = parse_int_list("2,1,2", "world sizes")
    variants = parse_choices("flat,flat,bucketed", "variant", ("flat", "bucketed"))
    assert ws == [2, 1] and variants == ["flat", "bucketed"]
    jobs = plan_jobs(ProfileOptions(tuple(variants), tuple(ws), bucket_sweep=(1.0, 25.0),
                                    train=TrainConfig(bucket_mb=25.0)), None)
    assert [j.job_id for j in jobs] == ["flat-ws2", "flat-ws1", "bucketed-ws2-b1",
                                        "bucketed-ws2-b25", "bucketed-ws1-b1", "bucketed-ws1-b25"]


def test_unexpected_error_is_one_line_not_a_traceback(monkeypatch, capsys, tmp_path):
    import dpcore.write.commands.profile as prof

    def broken(*a, **k):
        raise OSError("No space left on device")
    monkeypatch.setattr(prof, "run_profile", broken)
    rc = main(["profile", "--variants", "flat", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 1 and err.startswith("error: OSError: No space left on device") and err.count("\n") == 1


# --- validation lives in the options objects; the CLI takes its defaults from them -----------

def _refused(build, needle: str) -> None:
    from dpcore.contract.errors import UsageError
    with pytest.raises(UsageError) as info:
        build()
    assert needle in str(info.value) and "\n" not in str(info.value), str(info.value)


OPTION_CASES = [
    ("TrainConfig(width=0)", "--width must be >= 1, got 0"),
    ("TrainConfig(lr=float('nan'))", "--lr must be a finite number >= 0, got nan"),
    ("TrainConfig(model='transformer', size='huge')", "unknown size huge; valid choices: tiny"),
    ("TrainConfig(scaling='diagonal')", "unknown scaling mode diagonal; valid choices: weak, strong"),
    ("TrainConfig(bucket_mb=0.0)", "--bucket-mb must be a positive number of MB, at most 1048576, got 0"),
    ("TrainConfig(optimizer='lbfgs')", "unknown optimizer lbfgs; valid choices: sgd, adam, adamw"),
    ("ProfileOptions(inject_delay=(1, 0.0))", "--inject-delay must sleep between 0 and 60000 ms, got 0"),
    ("TrainConfig(model='resnet')", "--model must be one of mlp, transformer, einsum or MODULE:FUNCTION"),
    ("ProfileOptions(train=TrainConfig(steps=2))", "--profile-steps must be between 1 and --steps (2), got 3"),
    ("ProfileOptions(train=TrainConfig(model='toy'))", "--model must be one of mlp, transformer, einsum or"),
    ("ProfileOptions(world_sizes=(2,), inject_delay=(2, 5.0))",
     "--inject-delay rank 2 does not exist; valid ranks: 0..1"),
    ("ProfileOptions(world_sizes=(3,), train=TrainConfig(scaling='strong', batch_size=8))",
     "global batch 8 is not divisible by world size 3"),
    ("ProfileOptions(threads_per_rank=0)", "--threads-per-rank must be >= 1, got 0"),
    ("ProfileOptions(bucket_sweep=(0.0,))", "bad --bucket-sweep value '0.0'"),
    ("ProfileOptions(variants=('ddp',))", "unknown variant ddp; valid choices: single"),
    ("replace(ProfileOptions(), world_sizes=(0, 2))", "world sizes must be integers >= 1, got '0,2'"),
    ("ProfileOptions(progress='fancy')", "unknown progress mode fancy; valid choices: bar, json, none"),
    ("ProfileOptions(run_id='a/b')", "bad --run-id 'a/b'"),
    ("AllreduceOptions(backend='mpi')", "unknown backend 'mpi'; valid choices: auto, gloo, nccl"),
    ("AllreduceOptions(timeout_s=0)", "--timeout must be a number of seconds > 0"),
    ("AllreduceOptions(sizes=(1024, 6))", "--sizes must be multiples of 4 bytes (float32 elements), got 6"),
    ("AllreduceOptions(sizes=())", "--sizes is empty"),
    ("AllreduceOptions(algos=('tree',))", "unknown algorithm tree; valid choices: native, ring"),
    ("AllreduceOptions(repeats=-1)", "--repeats must be >= 0 (0 = adaptive), got -1"),
    ("VerifyOptions(world_size=0)", "--world-size must be >= 1, got 0"),
    ("VerifyOptions(model='resnet')", "--model must be one of mlp, transformer, einsum, toy or"),
]


@pytest.mark.parametrize("expr,needle", OPTION_CASES, ids=[e for e, _ in OPTION_CASES])
def test_options_refuse_bad_values_wherever_they_are_built(expr: str, needle: str) -> None:
    """A library caller or a test building the options gets the CLI's one-line error."""
    from dataclasses import replace

    from dpcore.contract import options
    from dpcore.contract.config import TrainConfig
    names = {"replace": replace, "TrainConfig": TrainConfig, **{n: getattr(options, n) for n in (
        "AllreduceOptions", "ProfileOptions", "VerifyOptions")}}
    _refused(lambda: eval(expr, names), needle)


def test_good_options_pass() -> None:
    from dpcore.contract.config import TrainConfig
    from dpcore.contract.options import ProfileOptions
    # without a trace, --profile-steps is not used (0 == no trace), and toy is verify's model
    opts = ProfileOptions(trace=False, train=TrainConfig(steps=2, profile_steps=0))
    assert opts.train.profile_steps == 0 and TrainConfig(model="toy").model == "toy"
    assert TrainConfig(model="mine:build").model == "mine:build"  # checked when loaded


def _captured(monkeypatch, module: str, func: str, returns: object) -> dict:
    """Replace ``module.func`` by a recorder of its arguments that returns ``returns``."""
    import importlib
    got: dict = {}

    def fake(*args, **kwargs):
        got.update(args=args, kwargs=kwargs)
        return returns
    monkeypatch.setattr(importlib.import_module(module), func, fake)
    return got


def test_cli_defaults_are_the_options_defaults(monkeypatch, tmp_path, capsys) -> None:
    """With no options, each command builds exactly its options class's defaults."""
    from dpcore.contract.options import AllreduceOptions, ProfileOptions, VerifyOptions

    got = _captured(monkeypatch, "dpcore.write.commands.profile", "run_profile", (0, None))
    assert main(["profile", "--out", str(tmp_path)]) == 0
    assert got["args"][0] == ProfileOptions(out=str(tmp_path))

    got = _captured(monkeypatch, "dpcore.write.commands.allreduce", "run_allreduce", (0, None))
    assert main(["allreduce", "--out", str(tmp_path)]) == 0
    assert got["args"][0] == AllreduceOptions(out=str(tmp_path))

    got = _captured(monkeypatch, "dpcore.write.commands.verify", "verify", ([], True))
    assert main(["verify"]) == 0
    assert got["args"][0] == VerifyOptions()  # the one options object, not rebuilt from its fields
    assert not list(tmp_path.iterdir())  # nothing ran


# --- issue 25: what the machine cannot hold, what cannot fit, empty items (items 2, 10, 11) -----

def _never_runs(monkeypatch) -> None:
    """Make every command's job runner a test failure: a refusal must come before it (and a
    fork bomb that got through would otherwise really start)."""
    import importlib

    def ran(*a, **k):
        raise AssertionError("the command ran instead of refusing its input")
    for mod, fn in (("dpcore.write.commands.profile", "run_profile"),
                    ("dpcore.write.commands.allreduce", "run_allreduce"),
                    ("dpcore.write.commands.verify", "run_verify"),
                    ("dpcore.write.commands.verify", "verify")):
        monkeypatch.setattr(importlib.import_module(mod), fn, ran)


REFUSED_BEFORE_RUNNING = [
    # item 2: a fork bomb otherwise (a store for 100,001 workers, then forks until fork() fails)
    (["profile", "--world-sizes", "100000"], "--world-sizes 100000 is more ranks than this machine can hold"),
    (["allreduce", "--world-sizes", "2,100000"], "--world-sizes 100000 is more ranks than this machine"),
    (["verify", "--world-size", "100000"], "--world-size 100000 is more ranks than this machine can hold"),
    (["profile", "--threads-per-rank", "100000"], "--threads-per-rank must be between 1 and"),
    # item 10: accepted, then every job failed
    (["profile", "--seed", str(2**64)], "--seed must be between 0 and 9223372036854775807"),
    (["profile", "--seed", "-1"], "--seed must be between 0 and"),
    (["profile", "--bucket-mb", "1e30"], "--bucket-mb must be a positive number of MB, at most 1048576"),
    (["profile", "--timeout", "1e-9"], "--timeout must be a number of seconds > 0, from 1 to 1000000"),
    (["verify", "--timeout", "0.001"], "--timeout must be a number of seconds > 0, from 1"),
    (["profile", "--batch-size", str(10**12)], "--batch-size 1000000000000 at world size 2 needs at least"),
    (["profile", "--width", str(10**9)], "--model mlp --width 1000000000 needs at least"),
    (["verify", "--model", "mlp", "--width", str(10**9)], "--width 1000000000 needs at least"),
    (["allreduce", "--sizes", "1000GB"], "--sizes 1073741824000 bytes at world size 4 needs at least"),
    # item 11: empty items were silently dropped; --out '' wrote into the current folder;
    # --run-id _x was written and hidden from every listing
    (["profile", "--world-sizes", "1,,2"], "empty item in world sizes '1,,2'"),
    (["profile", "--world-sizes", "1,2,"], "empty item in world sizes '1,2,'"),
    (["profile", "--variants", "flat,,flat"], "empty item in variant 'flat,,flat'"),
    (["profile", "--bucket-sweep", ",,"], "empty item in --bucket-sweep ',,'"),
    (["allreduce", "--sizes", "1KB,,4KB"], "empty item in --sizes '1KB,,4KB'"),
    (["allreduce", "--algos", "ring,"], "empty item in algorithm 'ring,'"),
    (["verify", "--variants", ","], "empty item in variant ','"),
    (["profile", "--out", ""], "--out is empty"),
    (["allreduce", "--out", " "], "--out is empty"),
    (["profile", "--run-id", "_x"], "bad --run-id '_x'"),
]


@pytest.mark.parametrize("argv,needle", REFUSED_BEFORE_RUNNING, ids=[" ".join(a) for a, _ in REFUSED_BEFORE_RUNNING])
def test_what_cannot_run_is_refused_before_anything_runs(argv, needle, capsys, tmp_path, monkeypatch):
    _never_runs(monkeypatch)
    monkeypatch.chdir(tmp_path)  # --out '' would write here
    extra = ["--out", str(tmp_path)] if argv[0] != "verify" and "--out" not in argv else []
    rc = main([*argv, *extra])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("error: ") and needle in err and err.count("\n") == 1, err
    assert not list(tmp_path.iterdir())


def test_the_world_size_bound_is_what_the_machine_holds(monkeypatch) -> None:
    """Known answer: with 1 GiB available and the open-file limit high, at most 10 ranks of
    >= 100 MiB; under torchrun the world exists already and is not bounded here."""
    import resource

    from dpcore.contract import limits
    monkeypatch.setattr(limits, "available_memory", lambda: 2**30)
    monkeypatch.setattr(resource, "getrlimit", lambda which: (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
    assert limits.max_local_ranks() == (10, "1.0 GiB of available memory at >= 100.0 MiB per rank")
    limits.check_world_sizes((1, 10), "--world-sizes")
    _refused(lambda: limits.check_world_sizes((11,), "--world-sizes"),
             "--world-sizes 11 is more ranks than this machine can hold: at most 10")
    for k, v in (("RANK", "0"), ("WORLD_SIZE", "64"), ("LOCAL_RANK", "0")):
        monkeypatch.setenv(k, v)
    limits.check_world_sizes((64,), "--world-sizes")


@pytest.mark.parametrize("argv,needle", [
    (["--world-sizes", str(10**8)], "--world-sizes 100000000 is beyond what whatif models"),
    (["--world-sizes", "2,,4"], "empty item in --world-sizes '2,,4'"),
    (["--bucket-mb", "1e30"], "bad --bucket-mb value '1e30'"),
    (["--bucket-mb", "1,,4"], "empty item in --bucket-mb '1,,4'"),
    (["--algo", ""], "unknown algorithm ''"),
])
def test_whatif_refuses_what_it_cannot_model(argv, needle, capsys, samples):
    sample = samples / "sample-train"  # its bucketed-ws2-b25 is the job refused
    rc = main(["whatif", str(sample), "--job", "bucketed-ws2-b25", *argv])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("error: ") and needle in err and err.count("\n") == 1, err


def test_whatif_without_a_job_names_the_jobs_to_choose_from(capsys, samples):
    """No --job: one line that lists the run's completed bucketed and torch_ddp jobs (or says it
    has none), not only what kind of job to give."""
    assert main(["whatif", str(samples / "sample-train")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "whatif needs --job" in err
    choices = err.split("valid choices: ")[1].strip().split(", ")
    assert len(choices) == 20 and "bucketed-ws2-b25" in choices and "torch_ddp-ws1-b1" in choices
    assert not any(c.startswith(("single", "ring", "zero1")) for c in choices)  # not replayable
    assert main(["whatif", str(samples / "sample-allreduce")]) == 2
    assert capsys.readouterr().err.endswith("valid choices: (none in this run)\n")


def test_built_in_model_sizes_match_the_models() -> None:
    """The torch-free parameter counts that refuse a too-large --width are the built models'."""
    from dpcore.contract.config import TrainConfig
    from dpcore.contract.limits import param_count
    from dpcore.write.training.models import build_module
    for cfg in (TrainConfig(model="mlp", width=48), TrainConfig(model="transformer", size="tiny"),
                TrainConfig(model="einsum")):
        model = build_module(cfg)
        assert param_count(cfg.model, cfg.size, cfg.width) == sum(p.numel() for p in model.parameters())


def _cli(args: list[str], cwd, timeout: int = 120) -> subprocess.CompletedProcess:
    from pathlib import Path
    env = {"PYTHONPATH": str(Path(__file__).parents[1]), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "dpcore", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=cwd, env=env)


@pytest.mark.parametrize("where", ["module", "function"])
def test_model_that_calls_sys_exit_is_one_line_exit_2(where, tmp_path):
    """Issue 25 item 11: it exited 3, silently, with the user's status."""
    body = ("import sys\nsys.exit(3)\n" if where == "module"
            else "import sys\ndef build():\n    sys.exit(3)\n")
    (tmp_path / "quitter.py").write_text(body)
    proc = _cli(["profile", "--model", "quitter:build", "--out", str(tmp_path / "out")], tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and lines[0].startswith("error: --model quitter:build: ") \
        and "sys.exit(3)" in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_model_that_never_returns_is_bounded_by_the_timeout(tmp_path):
    """Issue 25 item 11: it hung the CLI. --timeout 2 bounds loading; the subprocess timeout
    (120 s) is far above it, so only a hang fails this test, not a slow machine."""
    (tmp_path / "forever.py").write_text("import time\ndef build():\n    while True:\n        time.sleep(0.1)\n")
    proc = _cli(["profile", "--model", "forever:build", "--timeout", "2", "--out", str(tmp_path / "out")],
                tmp_path)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stderr
    assert len(lines) == 1 and "did not finish within --timeout (2 s)" in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_calibration_steps_bounds() -> None:
    """--calibration-steps: 0 turns the what-if calibration off; negative or above 100 is one line."""
    from dpcore.contract.config import TrainConfig
    from dpcore.contract.errors import UsageError

    assert TrainConfig(calibration_steps=0).calibration_steps == 0
    for bad in (-1, 101):
        with pytest.raises(UsageError, match="--calibration-steps"):
            TrainConfig(calibration_steps=bad)


def test_repeated_comm_hooks_run_once():
    """'none,none' is the plain job once (as repeated variants run once); 'fp16,none,fp16' adds
    one fp16 job beside it, at world sizes of 2 or more only."""
    from dpcore.contract.config import COMM_HOOKS, parse_choices
    from dpcore.contract.options import ProfileOptions
    from dpcore.write.commands.profile import plan_jobs

    def planned(text: str) -> list[str]:
        hooks = tuple(parse_choices(text, "comm hook", COMM_HOOKS, all_ok=False))
        return [j.job_id for j in plan_jobs(ProfileOptions(("torch_ddp",), (1, 2), comm_hooks=hooks), None)]
    assert planned("none,none") == ["torch_ddp-ws1-b25", "torch_ddp-ws2-b25"]
    assert planned("fp16,none,fp16") == ["torch_ddp-ws1-b25", "torch_ddp-ws2-b25", "torch_ddp-ws2-b25-fp16"]


# --- the re-probe's low findings: an empty import path, tls:// without TLS, a trace of numbers --

def test_import_of_an_empty_path_is_refused_not_the_current_folder(capsys, tmp_path, monkeypatch):
    """``import ''`` (an unset shell variable) read the folder the command ran in."""
    from tests.synthetic import write_gpu_trace_dir
    write_gpu_trace_dir(tmp_path / "here", world_size=2, steps=2, kernels_per_step=5, seed=1)
    monkeypatch.chdir(tmp_path)
    for empty in ("", "  "):
        rc = main(["import", empty, "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert rc == 2 and err == ("error: the path is empty; give a folder of torch.profiler traces or "
                                   "one trace file\n"), err
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_a_tls_scheduler_without_tls_configuration_is_one_line(capsys, tmp_path):
    """Dask's comm layer raised a TypeError for tls:// without a TLS context (no connection is
    tried: the error comes before it)."""
    pytest.importorskip("distributed")
    from tests.synthetic import write_gpu_trace_dir
    write_gpu_trace_dir(tmp_path / "job", world_size=2, steps=2, kernels_per_step=5, seed=1)
    rc = main(["analyze", str(tmp_path / "job"), "--no-cache", "--scheduler", "tls://127.0.0.1:1"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "TypeError" not in err, err
    assert err.startswith("error: cannot connect to the Dask scheduler at tls://127.0.0.1:1: tls:// needs "
                          "Dask's TLS configuration") and "give tcp://HOST:PORT" in err


@pytest.mark.parametrize("content", ["[1, 2, 3]", '{"traceEvents": []}'])
def test_analyze_of_a_file_without_events_is_one_line_exit_2(content, capsys, tmp_path):
    (tmp_path / "t.json").write_text(content)
    for extra in ([], ["--csv"]):
        rc = main(["analyze", str(tmp_path / "t.json"), "--no-cache", *extra])
        out, err = capsys.readouterr()
        assert rc == 2 and out == "" and err == (
            f"error: no events to analyse in {tmp_path / 't.json'}: not a torch.profiler trace (a JSON "
            "object or list of trace events), or one that recorded no step\n"), err
