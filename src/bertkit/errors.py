"""The one exception type for problems a user can fix (bad flag, bad file, bad input).

The command line prints a ``BertkitError`` as one line and exits 2; anything else is a bug in bertkit
and keeps its full traceback (exit 1). Both classes subclass the built-in they refine, so callers that
catch ``ValueError`` or ``FileNotFoundError`` keep working.
"""

from __future__ import annotations

import functools
import inspect
import json
import numbers
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any


class BertkitError(ValueError):
    """A user-caused error whose message names the value, the limit and the fix."""


def keyword_only(reference: tuple[str, ...], library: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A function (a method) whose later arguments are keyword-only in bertkit, where ``library``'s same call takes
    them by position too (``reference``: that call's positional names in order, ``self`` left out): a call with more
    positional arguments than bertkit's is refused naming what the library reads each extra one as, and to pass it by
    keyword (Python's own TypeError said "takes 3 positional arguments but 4 were given": no name, no fix)."""

    def wrap(fn: Callable[..., Any]) -> Callable[..., Any]:
        params = list(inspect.signature(fn).parameters.values())
        method = bool(params) and params[0].name == "self"
        taken = sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params) - method

        @functools.wraps(fn)
        def checked(*args: Any, **kwargs: Any) -> Any:
            given = args[1:] if method else args
            if len(given) > taken:
                kind = type(args[0]).__name__ if method else ""
                what = f"{kind}()" if fn.__name__ in ("__init__", "__call__") else f"{kind}.{fn.__name__}()".lstrip(".")
                extra = [(reference[i] if i < len(reference) else f"positional argument {i + 1}", given[i])
                         for i in range(taken, len(given))]
                read = ", ".join(f"{name} ({str(value)[:40]!r})" for name, value in extra)
                raise BertkitError(f"{what} takes {taken} argument(s) by position ({', '.join(reference[:taken])}), "
                                   f"got {len(given)}; {library} reads the others as {read}: pass "
                                   f"{'it' if len(extra) == 1 else 'them'} by keyword "
                                   f"({', '.join(f'{name}=...' for name, _ in extra)})")
            return fn(*args, **kwargs)

        return checked

    return wrap


class InputError(BertkitError):
    """The input itself is refused partway through a run (bytes that are not UTF-8, a corpus with nothing to make):
    its fix changes an input file or a setting, which a ``--resume`` refuses, so the run it cut short is not kept for
    one (``bertkit.runs.output_dir``) and would only refuse the corrected re-run."""


class MissingFileError(BertkitError, FileNotFoundError):
    """A file or directory the user named (or that a command needs) does not exist."""


class WriteError(BertkitError, OSError):
    """A write the file system refused (full, read-only, not permitted): one line on the command line, and still
    an ``OSError`` with its ``errno`` for callers that catch those."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.errno, self.strerror, self.message = code, message, message

    def __str__(self) -> str:
        return self.message


class NotImplementedInBertkit(BertkitError, AttributeError):
    """A method of a reference library's model (sentence-transformers') that bertkit does not implement: its message
    says what to use, and it is an AttributeError, so ``hasattr`` and ``getattr(model, name, default)`` see it as
    absent."""


def no_hub(owner: object) -> BertkitError:
    """The error for ``owner.push_to_hub(...)`` (a model's, a head's, a tokenizer's, a config's, as transformers has
    them): bertkit reaches no hub, so the directory is saved and uploaded with huggingface_hub."""
    return BertkitError(f"{type(owner).__name__}.push_to_hub is not implemented in bertkit (it reaches no hub): save "
                        "with .save_pretrained(DIR), then upload DIR with huggingface_hub "
                        "(HfApi().upload_folder(repo_id=REPO, folder_path=DIR), or `hf upload REPO DIR`)")


class NonFiniteError(BertkitError):
    """A loss, gradient or model output that is NaN or infinite: never turned into a score or saved weights.
    ``index``: the input (0-based, in the call's order) it came of, where one did."""

    def __init__(self, message: str, index: int | None = None):
        super().__init__(message)
        self.index = index


def nonfinite_cause(model: Any = None) -> str:
    """Why ``model``'s outputs came out NaN or infinite, with the fix. A float16 model overflows past 65504 on
    finite weights (an activation a float32 model holds easily), where "the weights are broken" sent the user to
    look for another checkpoint instead of loading this one in float32."""
    try:
        dtype = str(next(p.dtype for p in model.parameters() if p.is_floating_point()))
    except (AttributeError, StopIteration, TypeError):
        dtype = None
    if dtype == "torch.float16":
        return ("the model runs in float16, whose largest value is 65504, and its activations passed it: load it in "
                "float32 (model.float(), dtype=torch.float32) or in bfloat16, whose range is float32's")
    return "the checkpoint's weights are broken (a diverged run?): use one whose outputs are finite"


def given_path(path: str | os.PathLike, what: str) -> Path:
    """``path`` as a Path, an empty string refused: ``Path("")`` is ".", so the working directory would be read or
    written, unnamed, where no path was given (transformers refuses the name)."""
    if not os.fspath(path):
        raise BertkitError(f"{what} is an empty string; pass a directory ('.' for the working directory)")
    return Path(path)


def file_to_write(path: str | os.PathLike, what: str = "the output file") -> Path:
    """``path``, the name of one file to write, as a Path; refused when it ends in a separator (``preds/``): that
    names a directory, which the system will not open as a file (transformers' and torch's writers fail there), but
    ``Path("preds/")`` is ``preds``, so the output would be written as a file named like the directory meant."""
    text = os.fspath(path)
    seps = tuple(s for s in (os.sep, os.altsep) if s)
    if isinstance(text, str) and text.endswith(seps) and text.rstrip("".join(seps)):
        name = text.rstrip("".join(seps))
        raise BertkitError(f"{what} {text} ends in {text[-1]!r}, so it names a directory, not a file: give the file "
                           f"to write, {name} (without the {text[-1]!r}) or a file inside that directory")
    return Path(path)


def is_whole(value: Any, least: int = 1, most: float = float("inf")) -> bool:
    """Whether ``value`` is a whole number (a Python or numpy integer; a bool is no count) in [least, most]: the
    check of every size, count and k a caller gives, each refusal in its own words."""
    return not isinstance(value, bool) and isinstance(value, numbers.Integral) and least <= value <= most


class WholeSetting:
    """An attribute checked when it is set, so a constructor refuses it before any work (an evaluator given to a
    trainer first runs after steps of training): a whole number >= 1, or, where ``none`` says what None means, None.
    ``bound`` adds what else bounds it to the error."""

    def __init__(self, none: str | None = None, bound: str = ""):
        self.none, self.bound = none, bound

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        return self if obj is None else obj.__dict__[self.name]

    def __set__(self, obj: Any, value: Any) -> None:
        if not (value is None and self.none is not None) and not is_whole(value):
            raise BertkitError(f"{type(obj).__name__}: {self.name} {value!r} must be a whole number >= 1{self.bound}"
                               + (f", or None for {self.none}" if self.none is not None else ""))
        obj.__dict__[self.name] = None if value is None else int(value)


def refusing_getattr(module: str, refused: dict[str, str]) -> Callable[[str], Any]:
    """A module's ``__getattr__`` for the names a reference library's module has and bertkit does not implement:
    each raises a BertkitError with what to use (``refused[name]``), which ``from module import name`` shows as it
    is (it would turn an AttributeError into "cannot import name"); any other name is Python's AttributeError."""

    def __getattr__(name: str) -> Any:
        if name in refused:  # a BertkitError, not an AttributeError: `from module import name` keeps the message
            raise BertkitError(f"{module.removeprefix('bertkit.sentence.')}.{name} is not implemented in bertkit: "
                               f"{refused[name]}")
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def refuse_options(what: str, given: dict[str, Any], options: dict[str, tuple[Any, str]]) -> None:
    """Refuse by name each of transformers' keywords ``given`` to ``what`` at another value than transformers' default
    (``options``: name -> (default, what to do instead)), and any other keyword; at its default a keyword asks for
    what bertkit does, so it is taken. (A Python TypeError would name the keyword without a way on.)"""
    for name, value in given.items():
        if name not in options:
            raise BertkitError(f"{what} got an unknown argument {name!r}; of transformers' arguments it takes "
                               f"{', '.join(options)}, at their defaults")
        default, instead = options[name]
        if not (value is default or (type(value) is type(default) and value == default)):
            raise BertkitError(f"{what}({name}={value!r}) is not implemented in bertkit (only {name}={default!r}, "
                               f"transformers' default): {instead}")


def not_utf8(path: str | os.PathLike) -> BertkitError:
    """The error for a text file that is not UTF-8, naming the first bad byte's line and offset."""
    data = Path(path).read_bytes()
    try:
        data.decode("utf-8")
        where = "somewhere"
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        where = f"line {line}, byte {e.start} ({data[e.start:e.start + 1]!r})"
    return BertkitError(f"{path} is not UTF-8 text: {where}; convert it to UTF-8 (e.g. iconv -t UTF-8)")


class NotStandardJson(ValueError):
    """What Python's json module reads but JSON is not: a key repeated in one object, NaN or Infinity, half of a
    UTF-16 surrogate pair."""


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:  # json.loads would keep the last value without a word
            raise NotStandardJson(f"an object holds the key {key!r} twice")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:  # an id read as NaN would be written back out as no JSON at all
    raise NotStandardJson(f"{name} is not a JSON number")


_SURROGATE = re.compile("[\ud800-\udfff]")


def lone_surrogate(value: Any) -> str | None:
    """A surrogate code point in the strings of a parsed JSON value (object keys included), or None.
    json.loads joins an escaped pair ("\\ud83d\\ude00") into its character, so one left is half a pair: no
    character, which no UTF-8 file or answer can hold."""
    stack = [value]
    while stack:  # not recursive: a value nested as deep as the parser allows is walked too
        v = stack.pop()
        if isinstance(v, str):
            if found := _SURROGATE.search(v):
                return found.group()
        elif isinstance(v, dict):
            stack.extend(v.keys())
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return None


def standard_json(text: str | bytes, **kwargs: Any) -> Any:
    """``json.loads`` of standard JSON: a repeated key, NaN and Infinity raise ``NotStandardJson`` (the user's files
    and the server's bodies read alike), and so does a string holding half of a surrogate pair, which Python's
    parser takes (RFC 8259 section 8.2 leaves it to the reader; serde_json, which TEI reads with, refuses it): such a
    text has no UTF-8 form, so a prediction echoing it could not be written or answered."""
    value = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant, **kwargs)
    half = lone_surrogate(value)
    if half is not None:
        raise NotStandardJson(f"a string holds \\u{ord(half):04x}, half of a UTF-16 surrogate pair without its other "
                              "half (no character); escape both halves of the pair, or write the character itself "
                              "in UTF-8")
    return value


def read_json_object(path: str | os.PathLike, fix: str) -> dict[str, Any]:
    """A JSON file that must hold an object (a config, a manifest), or the error naming the file and ``fix``."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # not JSON, or not UTF-8
        raise BertkitError(f"{path} is not valid JSON ({e}); {fix}") from None
    if not isinstance(data, dict):
        raise BertkitError(f"{path} must hold a JSON object, got {type(data).__name__}; {fix}")
    return data
