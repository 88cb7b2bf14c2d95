"""Command-line flags derived from settings dataclasses: one field, one flag.

``learning_rate`` -> ``--learning-rate`` (underscores accepted too), help from the field's docstring, the default
shown, choices from ``Literal`` types. ``--config FILE`` (JSON) holds the same fields; flags on the command line win.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import json
import os
import re
import sys
import types
import typing
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError, MissingFileError
from bertkit.settings.fields import _not_none, on_command_line, type_hints


@functools.cache  # one parse per module: inspect.getsource(class) re-parses the whole module on every call
def _top_level_classes(module: str) -> dict[str, ast.ClassDef]:
    try:
        tree = ast.parse(inspect.getsource(sys.modules[module]))
    except (OSError, TypeError, KeyError):  # no source (a frozen install): flags keep their names and defaults
        return {}
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


@functools.cache
def field_docs(cls: type) -> types.MappingProxyType[str, str]:
    """Attribute docstrings (a string literal right after a field) of ``cls`` and its bases; subclasses win."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        node = _top_level_classes(klass.__module__).get(klass.__qualname__)
        if node is None:  # a nested or dynamically made class: no fields to document from source
            continue
        body = node.body
        for field_node, nxt in zip(body, body[1:]):
            if (isinstance(field_node, ast.AnnAssign) and isinstance(field_node.target, ast.Name)
                    and isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                    and isinstance(nxt.value.value, str)):
                docs[field_node.target.id] = " ".join(nxt.value.value.split())
    return types.MappingProxyType(docs)  # shared by every caller: read-only


def _flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def _converter(tp: Any, parse: Callable | None) -> tuple[Callable[[str], Any] | None, list | None, bool]:
    """(text -> value, choices, is a list) for a field's type."""
    if parse is not None:
        return _shown_errors(parse), None, False
    tp = _not_none(tp)  # X | None: the flag takes an X
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return type(args[0]), list(args), False
    if origin is tuple:  # tuple[int, ...]: a comma list
        return functools.partial(_comma_list, args[0]), None, False
    if origin is list:
        return _path if args[0] is Path else args[0], None, True
    if tp is Path:
        return _path, None, False
    if tp in (int, float, str):
        return tp, None, False
    return str, None, False  # Any (a preset name or a path)


def _path(text: str) -> Path:
    """A path flag's value; an empty one is refused: ``Path("")`` is ".", the working directory, which no one named
    (``errors.given_path``, the library's refusal of it)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path; pass a path ('.' for the working directory)")
    name = text.rstrip("/" + (os.altsep or ""))
    if name != text and name and os.path.exists(name) and not os.path.isdir(name):
        # Path drops the slash, so the file would be read (or replaced) where the system refuses the name
        raise argparse.ArgumentTypeError(f"{text} ends in '/', which names a directory, and {name} is a file: give "
                                         f"{name} without the '/'")
    return Path(text)


def _comma_list(item: type, text: str) -> tuple[Any, ...]:
    """``"-1,-2"`` -> ``(-1, -2)``; argparse would say "invalid partial value" for a ValueError: say what it takes."""
    parts = text.split(",") if text.strip() else []
    try:
        if any(not x.strip() for x in parts):  # "-1,,2": a value left out, not a list of two
            raise ValueError
        return tuple(item(x) for x in parts)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma-separated list of {item.__name__}, got {text!r} "
                                         f"(e.g. -1,-2)") from None


def _shown_errors(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """argparse prints "invalid <function name> value" for a ValueError: show the parser's own message."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except BertkitError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    return convert


def _shown(value: Any) -> str:
    if isinstance(value, tuple):
        return ",".join(str(v) for v in value)
    return str(value)


def _given_once(action: argparse.Action, namespace: argparse.Namespace, value: Any, shown: str) -> None:
    """Refuse a flag given twice with two values (by either of its spellings): argparse keeps the last without a
    word, so a flag repeated by mistake, or appended by a script to a command line that already holds it, would run
    with one of the two values unannounced. The same value twice says one thing, and is taken."""
    given = namespace.__dict__.setdefault("_given_flags", {})  # "_": no setting (build_settings)
    if action.dest in given and given[action.dest][1] != value:
        raise argparse.ArgumentError(action, f"given twice, as {given[action.dest][0]} and {shown}; give it once")
    given[action.dest] = (shown, value)


class _Once(argparse.Action):
    """A flag's value (argparse's ``store``), refused when given again with another (``_given_once``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        _given_once(self, namespace, values, f"{option_string} {_shown(values)}")
        setattr(namespace, self.dest, values)


class _OnceBool(argparse.BooleanOptionalAction):
    """``--flag`` / ``--no-flag``, refused when given both ways (``_given_once``)."""

    def __call__(self, parser, namespace, values, option_string=None):
        _given_once(self, namespace, not option_string.startswith("--no-"), option_string)
        super().__call__(parser, namespace, values, option_string)


def add_settings_flags(parser: argparse.ArgumentParser, cls: type, choices: dict[str, tuple[str, ...]] | None = None
                       ) -> None:
    """Declare one flag per field of the settings dataclass ``cls`` (defaults stay in the dataclass); ``choices``: the
    values a str field takes where the command knows them (serve's tasks), not the settings."""
    hints = type_hints(cls)
    docs = field_docs(cls)
    own = cls.__dict__.get("__annotations__", {})

    def order(f: dataclasses.Field) -> tuple[int, int]:  # required first, then the command's own, then shared
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        return (0 if required else 1 if f.name in own else 2, 0)

    for f in sorted(dataclasses.fields(cls), key=order):
        meta = f.metadata
        if not on_command_line(f):
            continue
        convert, known, many = _converter(hints[f.name], meta.get("parse"))
        known = list((choices or {}).get(f.name, ())) or known
        default = f.default if f.default is not dataclasses.MISSING else (
            f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
        required = default is dataclasses.MISSING
        help_text = docs.get(f.name, "").replace("%", "%%")  # argparse %-formats help ("15%" in a docstring)
        if meta.get("positional"):  # optional here: a --config file may give it (build_settings: when neither does)
            parser.add_argument(f.name, nargs="*" if many else "?", type=convert, help=help_text,
                                default=[] if many else None)  # not SUPPRESS: argparse makes that string a value
            continue
        if required:
            help_text += " (required)"
        elif default is not None:  # a "Default: ..." sentence says what None does, not the value a command gives
            help_text = help_text.split(" Default:")[0] + f" (default: {_shown(default)})"
        elif "Default:" not in help_text:
            help_text += f" (default: {_shown(default)})"
        names = [_flag_name(f.name), *meta.get("aliases", ())]
        if _not_none(hints[f.name]) is bool:  # bool | None: unset lets the command decide (--bf16 with --int8)
            parser.add_argument(*names, dest=f.name, action=_OnceBool, help=help_text,
                                default=argparse.SUPPRESS)
        else:
            parser.add_argument(*names, dest=f.name, action=_Once, type=convert, choices=known, help=help_text,
                                default=argparse.SUPPRESS, metavar=f.name.upper() if known is None else None)
    parser.add_argument("--config", dest="_config_file", type=_path, action="append", default=argparse.SUPPRESS,
                        metavar="FILE", help="a JSON file of these settings (paths in it are read from the working "
                        "directory); given twice, the later file wins; flags on the command line win")


def read_settings_file(path: Path) -> dict[str, Any]:
    if path.is_dir():
        raise BertkitError(f"--config {path} is a directory; give the JSON file of settings")
    if not path.is_file():
        raise MissingFileError(f"--config {path}: no such settings file (pretrain's model shape is --config-name)")
    try:
        text = path.read_text(encoding="utf-8-sig")  # the byte order mark an editor on Windows writes is not a key
    except UnicodeDecodeError as e:
        raise BertkitError(f"--config {path} is not UTF-8 text (byte {e.start}: {e.object[e.start:e.start + 1]!r}); "
                           "save it as UTF-8") from None
    try:
        values = json.loads(text, object_pairs_hook=functools.partial(_unique_keys, path))
    except json.JSONDecodeError as e:
        if path.suffix.lower() in (".yaml", ".yml"):  # transformers' HfArgumentParser.parse_yaml_file reads these
            raise BertkitError(f"--config {path}: a YAML file; --config reads JSON only (the same keys, as a JSON "
                               "object): write it as JSON, e.g. python -c \"import json, sys, yaml; "
                               "json.dump(yaml.safe_load(open(sys.argv[1])), sys.stdout)\" FILE.yaml > FILE.json"
                               ) from None
        raise BertkitError(f"--config {path}: not valid JSON ({e})") from None
    if not isinstance(values, dict):
        raise BertkitError(f"--config {path}: expected a JSON object of setting names to values, got "
                           f"{type(values).__name__ if values is not None else 'null'}")
    out: dict[str, Any] = {}
    for key, value in values.items():  # "max-seq-length" is max_seq_length: given both ways, it is given twice
        name = key.replace("-", "_")
        if name in out:
            raise BertkitError(f"--config {path}: the setting {name!r} is given twice (as {key!r} too); give it once")
        out[name] = value
    return out


def _unique_keys(path: Path, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose keys are unique: json.loads keeps the last of a repeated key without a word."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise BertkitError(f"--config {path}: the setting {key!r} is given twice; give it once")
        out[key] = value
    return out


def build_settings(cls: type, args: argparse.Namespace) -> Any:
    """The settings object from the settings files (if any; a later one wins) and the flags given; dataclass
    defaults fill the rest."""
    fields = {f.name: f for f in dataclasses.fields(cls) if on_command_line(f)}
    given = {k: v for k, v in vars(args).items() if not k.startswith("_") and k not in ("command", "family", "verbose")
             and not (k in fields and fields[k].metadata.get("positional") and v in (None, []))}  # left to a file
    values: dict[str, Any] = {}
    for path in vars(args).get("_config_file", []):
        values.update(_file_values(cls, fields, path))
    values.update(given)
    missing = [n if f.metadata.get("positional") else _flag_name(n) for n, f in fields.items() if n not in values
               and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
    if missing:
        raise BertkitError(f"missing required setting(s) {', '.join(missing)} (on the command line or in --config)")
    return cls(**values)


def _file_values(cls: type, fields: dict[str, dataclasses.Field], path: Path) -> dict[str, Any]:
    """A settings file's values, converted as the flags' are (file values are JSON types: strings and lists)."""
    values = read_settings_file(path)
    for f in dataclasses.fields(cls):  # a field the command fixes (pretrain's num_train_epochs): its run records it
        if f.name in values and f.name not in fields and f.default is not dataclasses.MISSING:
            if values[f.name] != json.loads(json.dumps(f.default, default=str)):
                raise BertkitError(f"--config {path}: {f.name} {values[f.name]!r} is not a setting of this command "
                                   f"(fixed at {f.default!r}); remove it")
            del values[f.name]
    unknown = sorted(set(values) - set(fields))
    if {"hidden_size", "num_attention_heads"} <= set(unknown):  # transformers' --config_name is a model's config
        raise BertkitError(f"--config {path} is a model's config.json (hidden_size, num_attention_heads, ...); "
                           "--config takes this command's settings: pass a model's directory as --model, and a "
                           "model shape to pretrain as --config-name FILE")
    aliases = {a.lstrip("-").replace("-", "_"): n for n, f in fields.items() for a in f.metadata.get("aliases", ())}
    if renamed := {k: aliases[k] for k in unknown if k in aliases}:  # "lr": a flag's other spelling, not its name
        raise BertkitError(f"--config {path}: a settings file names each setting by its field: "
                           + ", ".join(f"{n!r} for {k!r}" for k, n in renamed.items()))
    if unknown:
        raise BertkitError(f"--config {path}: unknown settings {unknown}"
                           f"{other_names_hint(['--' + k.replace('_', '-') for k in unknown])}; known: {sorted(fields)}")
    hints = type_hints(cls)
    for name, value in list(values.items()):
        parse = fields[name].metadata.get("parse")
        convert, _, many = _converter(hints[name], parse)
        try:
            if isinstance(value, str) and many:  # "files": "corpus/*.txt", one item as on the command line
                value = [convert(value)]
            elif isinstance(value, str) and hints[name] is not str:
                value = (parse or convert)(value)
            elif isinstance(value, list) and not many:
                value = tuple(value)
        except (ValueError, argparse.ArgumentTypeError) as e:  # BertkitError, float("abc"), a comma list
            raise BertkitError(f"--config {path}: {name}: {e}") from None
        values[name] = value  # its type is checked with the flags' values, when the settings are built
    return values


_NO_STAGES = ("is no flag here (bertkit finetune TASK trains and scores on dev, bertkit predict TASK predicts): "
              "leave it out")
# transformers' and google-research/bert's flags that bertkit names otherwise (underscores read as dashes): what they are
OTHER_NAMES = {
    "--per-device-train-batch-size": "is per process: give --batch-size, the global batch (per process x processes "
                                     "x --gradient-accumulation-steps)",
    "--train-batch-size": "is --batch-size here",
    "--per-device-eval-batch-size": "is --eval-batch-size here (predict: --batch-size)",
    "--predict-batch-size": "is --batch-size here",
    "--evaluation-strategy": "is --eval-strategy here (transformers' newer name)",
    "--overwrite-output-dir": "is --overwrite here (it replaces only what a bertkit run wrote there)",
    "--do-train": _NO_STAGES, "--do-eval": _NO_STAGES, "--do-predict": _NO_STAGES,
    "--warmup-proportion": "is --warmup-ratio here",
    "--num-train-steps": "is --max-steps here",
    "--num-warmup-steps": "is --warmup-steps here",
    "--save-checkpoints-steps": "is --save-steps here",
    "--init-checkpoint": "is --model-name-or-path here (pretrain: --init-from)",
    "--random-seed": "is --seed here",
    # transformers' convert_bert_original_tf_checkpoint_to_pytorch.py
    "--tf-checkpoint-path": "is --tf-checkpoint here",
    "--pytorch-dump-path": "is --output-dir here: a directory (config.json, model.safetensors, the tokenizer's files), "
                           "not one weights file",
}


def other_names_hint(words: list[str]) -> str:
    """What each of ``words`` (argparse's unrecognized arguments) that ``OTHER_NAMES`` holds is here."""
    said = [f"{name} {OTHER_NAMES[name]}" for name in dict.fromkeys(w.split("=")[0] for w in words)
            if name in OTHER_NAMES]
    return f" ({'; '.join(said)})" if said else ""


# "-1,-2": argparse reads a lone "-1" after a flag as its value, but a comma list of negative numbers as a flag
_NEGATIVE_LIST = re.compile(r"-\d[^,]*(,[^,]*)+")


def normalize_argv(argv: list[str]) -> list[str]:
    """``--learning_rate=3e-5`` -> ``--learning-rate=3e-5``: the underscore spellings of transformers' scripts;
    ``--layers -1,-2`` -> ``--layers=-1,-2``."""
    out: list[str] = []
    for arg in argv:
        flag = out[-1] if out else ""
        if flag.startswith("--") and flag != "--" and "=" not in flag and _NEGATIVE_LIST.fullmatch(arg):
            out[-1] = f"{flag}={arg}"
            continue
        if arg.startswith("--") and arg != "--":
            name, eq, value = arg.partition("=")
            arg = name.replace("_", "-") + eq + value
        out.append(arg)
    return out
