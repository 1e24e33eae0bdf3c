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


@pytest.mark.parametrize("sweep", ["abc", "nan", "inf", "-1", "0", "1,,x"])
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
    ("TrainConfig(bucket_mb=0.0)", "--bucket-mb must be a positive number of MB, got 0.0"),
    ("TrainConfig(optimizer='lbfgs')", "unknown optimizer lbfgs; valid choices: sgd, adam, adamw"),
    ("TrainConfig(delay_rank=1, delay_ms=0.0)", "--inject-delay must sleep between 0 and 60000 ms, got 0"),
    ("TrainConfig(model='resnet')", "--model must be one of mlp, transformer, einsum or MODULE:FUNCTION"),
    ("ProfileOptions(train=TrainConfig(steps=2))", "--profile-steps must be between 1 and --steps (2), got 3"),
    ("ProfileOptions(train=TrainConfig(model='toy'))", "--model must be one of mlp, transformer, einsum or"),
    ("ProfileOptions(world_sizes=(2,), train=TrainConfig(delay_rank=2, delay_ms=5.0))",
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

    got = _captured(monkeypatch, "dpcore.write.commands.verify", "run_verify", ([], True))
    assert main(["verify"]) == 0
    d = VerifyOptions()
    kw = got["kwargs"]
    assert (got["args"][0], kw["model"], kw["steps"], tuple(kw["variants"]), kw["backend"],
            kw["timeout_s"]) == (d.world_size, d.model, d.steps, d.variants, d.backend, d.timeout_s)
    assert not list(tmp_path.iterdir())  # nothing ran
