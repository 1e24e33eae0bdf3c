"""Options declared once: a dataclass field that is also a command-line option.

Why: an option written in three places (the argparse call, the options dataclass, the code that
copies one into the other) drifts; its help says one default and the dataclass holds another.
Here the field carries its flag, help, metavar, choices and how its text becomes a value, and
the CLI's parser (:func:`dpcore.cli.add_options`), the namespace-to-options step
(:func:`option_values`) and docs/cli.md's option tables (``scripts/option_tables.py``) are all
generated from the fields. Torch-free, like the rest of the contract.
"""
from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class OptionSpec:
    """How one field appears on the command line.

    ``parse`` turns the option's text into the field's value (None: argparse's ``type`` gives
    it); ``text`` turns the field's default into the text argparse shows and parses;
    ``negate`` marks a ``--no-X`` switch whose field is True unless it is given, ``switch`` a
    ``--X`` switch whose field is False unless it is given. A ``flag`` without a leading dash
    is a positional argument, named like its field (:attr:`positional`); ``optional``: one
    that may be left out (its field's default then)."""

    flag: str
    help: str
    metavar: str | None = None
    choices: tuple[str, ...] | None = None
    type: Callable[[str], Any] | None = None
    parse: Callable[[str], Any] | None = None
    text: Callable[[Any], str] | None = None
    negate: bool = False
    switch: bool = False
    optional: bool = False

    @property
    def positional(self) -> bool:
        """Whether the option is a positional argument (its flag has no leading dash)."""
        return not self.flag.startswith("-")

    def shown_metavar(self) -> str:
        """The value's name in usage lines: the given metavar, else the flag's (``--run-id`` RUN_ID)."""
        return self.metavar or self.flag.lstrip("-").replace("-", "_").upper()

    def default_text(self, default: Any) -> Any:
        """What argparse holds as the default: the text form where the value is parsed from text."""
        return self.text(default) if self.text is not None and default is not None else default


def option(default: Any = MISSING, *, default_factory: Any = MISSING, spec: OptionSpec | None = None,
           kw_only: Any = MISSING, **fields_of_spec: Any) -> Any:
    """A dataclass field that is also the option ``fields_of_spec`` describes (:class:`OptionSpec`'s
    fields), or the option ``spec`` declared elsewhere: several classes that take one option with
    different defaults (``--world-sizes``: profile 1,2, allreduce 2,4) share its one declaration.
    ``kw_only``: the field's own (a keyword-only field in a class whose others are positional)."""
    meta = {"option": spec if spec is not None else OptionSpec(**fields_of_spec)}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=meta, kw_only=kw_only)
    return field(default=default, metadata=meta, kw_only=kw_only)


def option_fields(cls: type) -> Iterator[tuple[Field[Any], OptionSpec]]:
    """Every field of ``cls`` (a dataclass, its bases' fields first) that is a command-line option."""
    for f in fields(cls):
        spec = f.metadata.get("option")
        if spec is not None:
            yield f, spec


def field_default(f: Field[Any]) -> Any:
    """A field's default value (its factory called where it has one)."""
    if f.default is not MISSING:
        return f.default
    if f.default_factory is not MISSING:
        return f.default_factory()
    raise KeyError(f"field {f.name!r} has no default")


def value_text(value: Any) -> str:
    """A value as an option's text: a float as short as reads back the same (25.0 -> '25',
    0.0123456789 -> '0.0123456789'), anything else as str()."""
    if isinstance(value, float):
        short = f"{value:g}"
        return short if float(short) == value else repr(value)
    return str(value)


def option_argv(obj: Any, keep: tuple[str, ...] = ()) -> list[str]:
    """The command-line arguments that give the option fields of ``obj`` (a dataclass) its values:
    a field at its default is left out (``keep``: given anyway), a ``--no-X`` switch is given when
    its field is False, a ``--X`` switch when True, a positional as its text. What the parser,
    fed these, gives back is ``obj``'s values again (the round trip the dashboard relies on)."""
    argv: list[str] = []
    for f, spec in option_fields(type(obj)):
        value = getattr(obj, f.name)
        try:
            default = field_default(f)
        except KeyError:
            default = MISSING
        if value == default and f.name not in keep:
            continue
        if spec.negate:
            argv += [spec.flag] if not value else []
        elif spec.switch:
            argv += [spec.flag] if value else []
        elif value is None:
            continue
        else:
            text = spec.text(value) if spec.text is not None else value_text(value)
            argv += [text] if spec.positional else [spec.flag, text]
    return argv


def option_values(args: Any, cls: type) -> dict[str, Any]:
    """The options of ``cls`` as values from a parsed namespace whose attributes are named like
    the fields: text parsed (a bad value raises the parser's UsageError), ``--no-X`` inverted."""
    values: dict[str, Any] = {}
    for f, spec in option_fields(cls):
        value = getattr(args, f.name)
        if spec.negate:
            value = not value
        elif spec.switch:
            value = bool(value)
        elif spec.parse is not None and value is not None:
            value = spec.parse(value)
        values[f.name] = value
    return values
