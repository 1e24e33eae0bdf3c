"""The command spine: every command is one declaration (dpcore.commands.COMMANDS), every option
one field declared once, and the options objects round-trip through the command line."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, replace
from typing import Any

import pytest

from dpcore.commands import COMMANDS, Command
from dpcore.contract.config import TrainConfig
from dpcore.contract.option_fields import OptionSpec, option, option_fields
from dpcore.contract.options import (
    AllreduceOptions,
    CommandOptions,
    ProfileOptions,
    VerifyOptions,
)

#: Flags two classes declare on purpose, each for its own meaning: whatif's --bucket-mb is the
#: list of bucket sizes a prediction is made for, TrainConfig's the one cap a job trains with.
SEPARATE_MEANINGS = {"--bucket-mb": {"TrainConfig", "WhatifOptions"}}


def _classes() -> set[type]:
    """Every options class a command reads its options from (its own and TrainConfig)."""
    return {g.cls for c in COMMANDS for g in c.groups}


def test_each_flag_is_declared_once() -> None:
    """A flag two commands share is one OptionSpec: inherited from a shared base, or the one
    spec given with another default (--world-sizes, --warmup); never a second declaration."""
    specs: dict[str, dict[int, set[str]]] = {}
    for cls in _classes():
        for _, spec in option_fields(cls):
            if spec.positional:  # a command's own argument (PATH, RUN), named by its field: no flag
                continue
            specs.setdefault(spec.flag, {}).setdefault(id(spec), set()).add(cls.__name__)
    twice = {flag: sorted(sorted(names) for names in by_spec.values())
             for flag, by_spec in specs.items() if len(by_spec) > 1}
    assert set(twice) == set(SEPARATE_MEANINGS), twice
    for flag, owners in SEPARATE_MEANINGS.items():
        assert {n for names in twice[flag] for n in names} == owners
    # the flags the job commands once each declared for themselves are one declaration each now
    for flag in ("--device", "--backend", "--timeout", "--dtype", "--out", "--name", "--variants", "--comm-hook",
                 "--world-sizes", "--csv", "--warmup"):
        assert len(specs[flag]) == 1, (flag, specs[flag])
    assert {"ProfileOptions", "AllreduceOptions", "WhatifOptions"} <= specs["--world-sizes"][
        next(iter(specs["--world-sizes"]))]


def _subparsers(ap: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in ap._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_option_and_argument_has_help() -> None:
    from dpcore.cli import build_parser

    silent = [f"{name} {a.option_strings[0] if a.option_strings else a.dest}"
              for name, p in _subparsers(build_parser()).items() for a in p._actions
              if a.dest != "help" and not (a.help and a.help.strip())]
    assert not silent, silent
    analyze = _subparsers(build_parser())["analyze"].format_help()
    assert "a run directory, a job's traces folder" in analyze and "CSV rows" in analyze


def test_the_parser_has_one_subparser_per_declaration() -> None:
    from dpcore.cli import build_parser

    assert list(_subparsers(build_parser())) == [c.name for c in COMMANDS]
    assert len({c.name for c in COMMANDS}) == len(COMMANDS)


def _parsed(command: str, argv: list[str]) -> argparse.Namespace:
    from dpcore.cli import build_parser

    return build_parser().parse_args([command, *argv])


PROFILES = [
    ProfileOptions(),
    ProfileOptions(variants=("ring", "torch_ddp"), world_sizes=(1, 2, 4), bucket_sweep=(1.0, 10.0),
                   comm_hooks=("none", "fp16"), pin=False, inject_hang=(1, 3, "sleep"), hang_timeout_s=30.5,
                   threads_per_rank=2,
                   inject_delay=(1, 20.25), device="cpu", backend="gloo", timeout_s=120.0, out="runs", name="x",
                   run_id="r-1", progress="json",
                   train=TrainConfig(model="transformer", size="small", width=64, batch_size=8, scaling="strong",
                                     steps=7, warmup=0, profile_steps=2, bucket_mb=0.125, lr=0.0123456789, seed=5,
                                     dtype="bf16", optimizer="adamw", calibration_steps=0, powersgd_rank=2)),
    ProfileOptions(trace=False, train=TrainConfig(model="einsum", batch_size=5120, profile_steps=0)),
    ProfileOptions(train=TrainConfig(model="einsum", batch_size=32)),  # the batch is kept, not the model's
]


@pytest.mark.parametrize("opts", PROFILES, ids=range(len(PROFILES)))
def test_profile_options_round_trip_through_the_command_line(opts: ProfileOptions) -> None:
    assert ProfileOptions.from_args(_parsed("profile", opts.to_argv())) == opts


def test_allreduce_and_verify_options_round_trip() -> None:
    for opts in (AllreduceOptions(), AllreduceOptions(algos=("ring",), world_sizes=(2, 3), sizes=(4, 2**20),
                                                      warmup=0, repeats=7, timeout_s=61.0)):
        assert AllreduceOptions.from_args(_parsed("allreduce", opts.to_argv())) == opts
    for v in (VerifyOptions(), VerifyOptions(model="mlp", steps=3, width=64, lr=0.5, batch_size=4, dtype="fp32",
                                             world_size=3, variants=("single", "torch_ddp"), comm_hooks=("fp16",))):
        assert VerifyOptions.from_args(_parsed("verify", v.to_argv())) == v


def test_verify_takes_the_one_dtype_option_and_profile_resolves_the_model_batch() -> None:
    assert VerifyOptions.from_args(_parsed("verify", ["--dtype", "bf16"])).dtype == "bf16"
    assert ProfileOptions.from_args(_parsed("profile", ["--model", "einsum"])).train.batch_size == 5120
    assert ProfileOptions.from_args(_parsed("profile", [])).train.batch_size == 32


def test_the_model_batch_table_is_the_models() -> None:
    from dpcore.contract.config import MODEL_BATCH_SIZES
    from dpcore.write.training.models import default_batch_size

    assert {m: default_batch_size(m) for m in MODEL_BATCH_SIZES} == MODEL_BATCH_SIZES


# --- a command added to the table is in --help and runs -----------------------------------------

@dataclass(frozen=True, kw_only=True)
class EchoOptions(CommandOptions):
    """A made-up command's options."""

    words: str = option("", flag="words", help="what to say")
    times: int = option(1, flag="--times", type=int, help="how often (default %(default)s)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.times < 1:
            from dpcore.contract.errors import UsageError
            raise UsageError(f"--times must be >= 1, got {self.times}")


SEEN: list[Any] = []


def _echo(options: EchoOptions) -> str:
    SEEN.append(options)
    return " ".join([options.words] * options.times) + "\n"


ECHO = Command("echo", "say the words again", EchoOptions, _echo)


def test_a_declared_command_shows_in_help_and_runs(capsys: pytest.CaptureFixture[str]) -> None:
    from dpcore.cli import main

    table = (*COMMANDS, ECHO)
    with pytest.raises(SystemExit):
        main(["--help"], commands=table)
    assert "say the words again" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["echo", "--help"], commands=table)
    out = capsys.readouterr().out
    assert "what to say" in out and "how often (default 1)" in out
    SEEN.clear()
    assert main(["echo", "hi", "--times", "3"], commands=table) == 0
    assert capsys.readouterr().out == "hi hi hi\n"
    assert SEEN == [EchoOptions(words="hi", times=3)]
    assert main(["echo", "hi", "--times", "0"], commands=table) == 2
    assert capsys.readouterr().err == "error: --times must be >= 1, got 0\n"
    assert main(["echo", "hi"]) == 2  # not in the real table
    assert "invalid choice: 'echo'" in capsys.readouterr().err


def test_the_real_commands_are_dispatched_through_their_declarations(monkeypatch: pytest.MonkeyPatch,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Replacing a declaration's run function replaces what the command runs."""
    from dpcore.cli import main
    from dpcore.contract.options import WhatifOptions

    got: list[WhatifOptions] = []

    def fake(options: WhatifOptions) -> str:
        got.append(options)
        return "done\n"
    table = tuple(replace(c, run=fake) if c.name == "whatif" else c for c in COMMANDS)
    assert main(["whatif", "r", "--world-sizes", "2,4"], commands=table) == 0
    assert capsys.readouterr().out == "done\n"
    assert got == [WhatifOptions(run="r", world_sizes=(2, 4))]


def test_shared_option_specs_are_one_object() -> None:
    fields_of = {cls: {f.name: spec for f, spec in option_fields(cls)} for cls in _classes()}
    assert fields_of[ProfileOptions]["world_sizes"] is fields_of[AllreduceOptions]["world_sizes"]
    assert fields_of[AllreduceOptions]["warmup"] is fields_of[TrainConfig]["warmup"]
    assert fields_of[VerifyOptions]["device"] is fields_of[ProfileOptions]["device"]
    assert isinstance(fields_of[ProfileOptions]["device"], OptionSpec)


def test_the_new_run_form_launches_its_profile_options(tmp_path) -> None:
    """The dashboard's command is ProfileOptions.to_argv: parsed back by the CLI it is the very
    options the form built (its defaults are the command's: none typed in the launcher)."""
    from dpcore.read.dashboard.launcher import QUICK, build_command, form_options

    for args, kwargs in (((tmp_path, "transformer", "small", ["torch_ddp", "fsdp"], [2, 4], 7, 4.0, [1.0, 8.0]),
                          dict(optimizer="adam", width=64, device="cpu", backend="gloo", dtype="bf16")),
                         ((tmp_path, "einsum", "tiny", ["single"], [1], 5, 25.0, []), {})):
        opts = form_options(*args, **kwargs)  # type: ignore[arg-type]
        cmd = build_command(*args, **kwargs)  # type: ignore[arg-type]
        assert cmd[1:4] == ["-m", "dpcore", "profile"]
        assert ProfileOptions.from_args(_parsed("profile", cmd[4:])) == opts
    assert form_options(tmp_path, "einsum", "tiny", ["single"], [1], 5, 25.0, []).train.batch_size == 5120
    quick = form_options(tmp_path, **QUICK)  # type: ignore[arg-type]
    assert (quick.device, quick.backend, quick.train.dtype, quick.train.optimizer, quick.progress) == (
        "auto", "auto", "auto", "sgd", "json")
