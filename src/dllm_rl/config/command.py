"""One front end for every command with a config dataclass: ``dllm-rl COMMAND [CONFIG.yaml] [key=value ...]
[--key value ...]``.

:func:`add_command_arguments` gives a command's parser the words (an optional YAML file, then ``a.b=c`` overrides)
and one flag per key of the dataclass, at any depth, named after the key (``train.max_steps`` ->
``--train.max-steps VALUE``; a bool is ``--key / --no-key``, in a section ``--run.progress / --run.no-progress``,
the earlier ``--no-run.progress`` hidden; a list is repeatable, ``--prompt A --prompt B``).
:func:`load_command` reads them back through :func:`~dllm_rl.config.loading.load_config`: the YAML first, then
the overrides, then the flags, so a flag is one more override, checked and converted as the YAML's values are. The
flags, ``--help-config`` and ``docs/config.md`` are all generated from the one dataclass. A list of numbers also
takes comma-separated values (``--thresholds 0.5,0.7``), a mapping ``KEY=VALUE`` items (``--task-options
task_type=countdown``, repeatable) or a YAML mapping; a list ``positional`` key collects every bare word
(``plot RUN_DIR RUN_DIR``).

A renamed key (the class's ``RENAMED``, :mod:`dllm_rl.config.renames`) keeps its old flag for one release
(``--gen-length`` for ``decode.gen_length``): hidden from ``--help``, read as an override of the old key, so it is
carried to the new one with the same one-line deprecation as the YAML's old keys. A class may give keys short flags
in a ``SHORT_FLAGS`` class attribute (``{"-o": "run.output_dir"}``). A list key whose field metadata says
``"several": True`` takes several values in one flag as well (``--served-model-name a b``, vLLM's spelling).

A command may have options of its own beside its config (``demo --model gemma --recipe speed`` beside the RL keys):
:func:`add_option_flags` gives them flags generated from a second small dataclass (named after the key, or as its
``FLAGS`` class attribute says: ``{"kind": "--model"}``), and :func:`load_options` reads them back. Added first,
they take precedence over an old hidden flag of the config of the same spelling, which is then left out.

``--help`` lists key by key only the command's own keys and the shared sections (``help_sections``: the top-level
keys, ``model.`` and ``run.``); every other section is one line naming ``--help-config SECTION``, its flags parsed
but not listed (rl's every key made a --help of 700 lines).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import typing
from collections.abc import Iterator
from typing import Any, TypeVar

from dllm_rl.config.fields import allowed_values, field_types, help_text, strip_optional, type_origin
from dllm_rl.config.loading import load_config
from dllm_rl.config.renames import renames
from dllm_rl.config.yaml_io import yaml_load
from dllm_rl.errors import UserError

T = TypeVar("T")

#: the namespace prefix of a flag's value (``config:train.max_steps``), which no other argument uses
_DEST = "config:"
#: the prefix of a command's own option (:func:`add_option_flags`): ``option:kind``
_OPTION = "option:"
_WORDS = "[CONFIG.yaml] [key=value ...]"
#: the sections ``--help`` lists key by key ("": the top-level keys); each other one is a line
HELP_SECTIONS = ("", "model", "run")


def leaf_keys(cls: type, prefix: str = "") -> Iterator[tuple[str, dataclasses.Field, Any]]:
    """``(dotted key, field, annotation without Optional)`` of every key of ``cls`` that is not a section, sections
    descended into in declaration order."""
    types_ = field_types(cls)
    for f in dataclasses.fields(cls):
        tp, _ = strip_optional(types_[f.name])
        if dataclasses.is_dataclass(tp):
            yield from leaf_keys(tp, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, types_[f.name]


def flag_name(key: str) -> str:
    """The flag of config key ``key``: ``train.max_steps`` -> ``--train.max-steps``."""
    return "--" + key.replace("_", "-")


def add_command_arguments(parser: argparse.ArgumentParser, cls: type, *, positional: str | None = None,
                          words_help: str = "", help_sections: tuple[str, ...] = HELP_SECTIONS) -> None:
    """Add to ``parser`` the words ``[CONFIG.yaml] [key=value ...]`` and one flag per key of ``cls``
    (:func:`leaf_keys`), grouped by section. ``positional``: a key that a bare word also sets (``eval MODEL_DIR``).
    Unset flags leave nothing in the namespace, so only what the user gave overrides the YAML. ``--help`` lists the
    flags of the top-level sections in ``help_sections`` ("" the top-level keys); every other section is a line."""
    words = _WORDS if positional is None else f"[{usage_word(cls, positional)}] {_WORDS}"
    parser.add_argument("words", nargs="*", metavar=words,
                        help=words_help or "a YAML config, then key=value overrides (see --help-config)")
    parser.usage = f"%(prog)s {words} [--KEY VALUE ...]"  # argparse's own would list every flag (100+ lines)
    groups: dict[str, Any] = {}
    short = {key: flag for flag, key in getattr(cls, "SHORT_FLAGS", {}).items()}
    leaves = {key: tp for key, _, tp in leaf_keys(cls)}
    for key, f, tp in leaf_keys(cls):
        top = key.partition(".")[0] if "." in key else ""
        listed = top in help_sections
        section = key.rpartition(".")[0] if listed else top
        if section not in groups:
            groups[section] = _group(parser, cls, section, listed)
        allowed = allowed_values(tp, f.metadata)
        text = help_text(f) + (f" (one of: {', '.join(map(str, allowed))})" if allowed is not None else "")
        text = text.replace("%", "%%") if listed else argparse.SUPPRESS  # argparse %-formats help
        kw: dict[str, Any] = {"dest": _DEST + key, "default": argparse.SUPPRESS, "help": text}
        if f.metadata.get("several"):  # a list flag that takes several values at once: --names a b
            kw["nargs"] = "+"
        _add_flag(groups[section], (flag_name(key), *([short[key]] if key in short else [])), tp, kw)
    taken = {option for action in parser._actions for option in action.option_strings}
    for old, (new, convert) in renames(cls).items():  # the old flags of renamed keys: hidden, read as the old key
        if new in leaves and flag_name(old) not in taken:
            _add_flag(parser, (flag_name(old),), old_flag_type(convert, leaves[new]),
                      {"dest": _DEST + old, "default": argparse.SUPPRESS, "help": argparse.SUPPRESS})


#: the name a usage line gives the bare word of a key (others: the key's last part in capitals)
_WORD_NAMES = {"model.path": "MODEL_DIR", "runs": "RUN_DIR"}


def usage_word(cls: type, positional: str) -> str:
    """What a usage line calls the bare word of key ``positional``: ``MODEL_DIR``, ``TASK``; ``RUN_DIR ...`` where
    the key is a list that every bare word fills."""
    name = _WORD_NAMES.get(positional, positional.rpartition(".")[2].upper())
    return name + (" ..." if _is_list(_leaf_type(cls, positional)) else "")


def _leaf_type(cls: type, key: str) -> Any:
    return {k: tp for k, _, tp in leaf_keys(cls)}.get(key)


def _is_list(tp: Any) -> bool:
    return type_origin(strip_optional(tp)[0]) in (list, tuple)


def _group(parser: argparse.ArgumentParser, cls: type, section: str, listed: bool) -> Any:
    """The argument group of ``section`` ("": the top-level keys): a listed one's title names its flags' form; an
    unlisted one's description is the one line that stands for its flags."""
    title = f"{section} (--{section}.KEY VALUE)" if section else f"{cls.__name__} (--KEY VALUE)"
    if listed:
        return parser.add_argument_group(title)
    count = sum(1 for key, _, _ in leaf_keys(cls) if (key.startswith(f"{section}.") if section else "." not in key))
    what = help_text(next(f for f in dataclasses.fields(cls) if f.name == section)) if section else "the top-level keys"
    where = f"--help-config {section}" if section else "--help-config"
    text = f"{count} keys, listed by {where}: {what.partition('; ')[0]}"  # its first clause: a line or two
    return parser.add_argument_group(title, text.replace("%", "%%"))


def old_flag_type(convert: Any, new_type: Any) -> Any:
    """The type an old key's flag takes: the new key's, or what the rename's ``convert`` declares it reads (its
    parameter's annotation: ``train.cpu``'s ``bool`` for ``model.device``, so ``--train.cpu`` stays a switch)."""
    if convert is None:
        return new_type
    hints = typing.get_type_hints(convert)
    hints.pop("return", None)
    return next(iter(hints.values()), new_type)


def _add_flag(group: Any, options: tuple[str, ...], tp: Any, kw: dict[str, Any]) -> None:
    """One flag of a key of type ``tp``: a bool is ``--key / --no-key`` (:func:`negative_flags`), a list repeatable
    (with ``nargs`` in ``kw``, each flag taking that many values; a list of numbers also comma-separated), a mapping
    repeatable ``KEY=VALUE`` items, else one value."""
    bare, _ = strip_optional(tp)
    if bare is bool:
        no, *old = negative_flags(options[0])
        group.add_argument(*options, no, action=_Switch, negative=(no,), **kw)
        for flag in old:  # the negative of earlier releases, before the key's last part: hidden
            group.add_argument(flag, action=_Switch, negative=(flag,), **{**kw, "help": argparse.SUPPRESS})
    elif type_origin(bare) is dict:
        group.add_argument(*options, action=_MappingFlag, metavar="KEY=VALUE", **kw)
    elif _is_list(bare) and set(typing.get_args(bare)[:1]) <= {int, float}:
        group.add_argument(*options, action="extend", type=_commas, metavar="VALUE[,VALUE...]", **kw)
    else:
        action = ("extend" if "nargs" in kw else "append") if _is_list(bare) else "store"
        group.add_argument(*options, action=action, metavar="VALUE", **kw)


def negative_flags(flag: str) -> tuple[str, ...]:
    """The flags that set bool key ``flag`` false: ``--no-chat``; in a section, ``--run.no-progress`` and (hidden,
    the spelling of earlier releases) ``--no-run.progress``."""
    section, dot, name = flag[2:].rpartition(".")
    return (f"--{section}{dot}no-{name}", *([f"--no-{flag[2:]}"] if dot else []))


class _Switch(argparse.Action):
    """A bool key's flag: true, or false for one of its ``negative`` spellings (argparse's BooleanOptionalAction
    puts ``--no-`` before the whole name: ``--no-run.progress``, which reads as negating a section)."""

    def __init__(self, option_strings, dest, negative=(), **kw):
        super().__init__(option_strings, dest, nargs=0, **kw)
        self.negative = frozenset(negative)

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, option_string not in self.negative)


def _commas(text: str) -> list[str]:
    return [part.strip() for part in text.split(",") if part.strip()]


class _MappingFlag(argparse.Action):
    """A mapping key's flag: each value one ``KEY=VALUE`` item (the value read as YAML) or a YAML mapping, merged
    over the earlier ones, so ``--task-options a=1 --task-options b=2`` gives ``{a: 1, b: 2}``."""

    def __call__(self, parser, namespace, values, option_string=None):
        text = str(values).strip()
        try:
            if not text.startswith("{") and "=" in text:
                key, raw = text.split("=", 1)
                item = {key.strip(): yaml_load(raw, f"{option_string} {text!r}")}
            else:
                item = yaml_load(text, f"{option_string} {text!r}")
        except UserError as exc:
            raise argparse.ArgumentError(self, str(exc)) from None
        if not isinstance(item, dict):
            raise argparse.ArgumentError(self, f"{text!r}: expected KEY=VALUE or a mapping {{key: value}}")
        setattr(namespace, self.dest, {**getattr(namespace, self.dest, {}), **item})


def given_flags(args: argparse.Namespace, prefix: str = _DEST) -> list[str]:
    """The flags the user gave, as ``key=value`` overrides (a repeated list flag: its values as one YAML list)."""
    out = []
    for dest, value in vars(args).items():
        if not dest.startswith(prefix):
            continue
        if isinstance(value, bool):
            value = "true" if value else "false"
        elif isinstance(value, (list, dict)):  # JSON is YAML: it reads back as given, commas inside values kept
            value = json.dumps(value, default=str)
        out.append(f"{dest[len(prefix):]}={value}")
    return out


def split_words(words: list[str], positional: str | None = None, many: bool = False) -> tuple[str | None, list[str]]:
    """The YAML file and the ``key=value`` overrides of a command's words: the YAML file is the first word ending in
    .yaml / .yml before any override (so it may follow the positional word: ``eval MODEL_DIR CONFIG.yaml``), or
    (without a ``positional`` key) a first word without ``=``; a bare word is ``positional=word`` (with ``many``, a
    list key: every bare word, in order, one item of it)."""
    config, overrides, bare = None, [], []
    for i, word in enumerate(words):
        if config is None and not overrides and (word.endswith((".yaml", ".yml")) or
                                                 (i == 0 and positional is None and "=" not in word)):
            config = word
        elif "=" in word:
            overrides.append(word)
        elif positional is not None and (many or not bare):
            bare.append(word)
        else:
            raise UserError(f"{word!r}: expected key=value (a YAML config file goes first, ending in .yaml)")
    if bare:
        overrides.insert(0, f"{positional}={json.dumps(bare) if many else bare[0]}")
    return config, overrides


def load_command(cls: type[T], args: argparse.Namespace, example: str | None, *,
                 positional: str | None = None) -> T:
    """The config of a command line ``COMMAND [CONFIG.yaml] [key=value ...] [--key value ...]`` (the arguments
    :func:`add_command_arguments` added): the YAML, laid over with the overrides, then the flags. None of them is
    one line naming ``example``; with ``example=None`` it is the defaults (a command that needs no setting)."""
    many = positional is not None and _is_list(_leaf_type(cls, positional))
    config, overrides = split_words(list(getattr(args, "words", None) or []), positional, many)
    overrides += given_flags(args)
    if config is None and not overrides and example is not None:
        raise UserError(f"give a config file (e.g. {example}), key=value overrides and/or --key value flags")
    return load_config(cls, config, overrides)


def option_flag(cls: type, key: str) -> str:
    """The flag of a command's own option ``key`` (:func:`add_option_flags`): the class's ``FLAGS`` spelling, else
    the key's."""
    return getattr(cls, "FLAGS", {}).get(key, flag_name(key))


def add_option_flags(parser: argparse.ArgumentParser, cls: type, description: str = "") -> None:
    """Add to ``parser`` one flag per key of ``cls``, the command's own options beside its config, listed in a group
    of their own (``description`` under its title); a key with a fixed set of values is checked by argparse, which
    names the flag. Call it before :func:`add_command_arguments`: an old hidden flag of the config that one of these
    takes is then left out (demo's ``--model`` is the demo model's kind, not RL's old ``model`` key)."""
    group = parser.add_argument_group(f"{cls.__name__} (--KEY VALUE)", description.replace("%", "%%") or None)
    for key, f, tp in leaf_keys(cls):
        allowed = allowed_values(tp, f.metadata)
        text = help_text(f) + (f" (one of: {', '.join(map(str, allowed))})" if allowed is not None else "")
        kw: dict[str, Any] = {"dest": _OPTION + key, "default": argparse.SUPPRESS, "help": text.replace("%", "%%")}
        if allowed is not None:
            kw["choices"] = [str(value) for value in allowed]
        _add_flag(group, (option_flag(cls, key),), tp, kw)


def load_options(cls: type[T], args: argparse.Namespace) -> T:
    """The options of :func:`add_option_flags` as given on the command line (the others at their defaults),
    checked as a config's values."""
    return load_config(cls, None, given_flags(args, _OPTION))


__all__ = ["HELP_SECTIONS", "add_command_arguments", "add_option_flags", "flag_name", "given_flags", "leaf_keys",
           "load_command", "load_options", "negative_flags", "old_flag_type", "option_flag", "split_words"]
