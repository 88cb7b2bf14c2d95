"""``AddedToken``: a token cut out of the text before WordPiece, with the matching options of the ``tokenizers``
library's class of that name, and which of those options bertkit matches as written.

bertkit matches a special token exactly as written, in the raw text, and another added token in the normalized
(lower-cased, accent-stripped) text, as ``add_tokens`` adds it; either inside words too, its offsets covering the token
alone. That is what transformers does with an ``AddedToken`` at its defaults (``normalized`` True for an ordinary
token, False for a special one; ``single_word``, ``lstrip``, ``rstrip`` False). A token asking for other matching
(a whole word only, the whitespace beside it taken into it, a special token matched in the normalized text) is
refused, naming the option, wherever it comes from: ``add_tokens``, ``add_special_tokens`` or a file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bertkit.errors import BertkitError

_OPTIONS = ("single_word", "lstrip", "rstrip", "normalized")


class AddedToken:
    """transformers' (tokenizers') ``AddedToken``: ``content`` and its options. ``normalized`` left out is
    ``not special``, decided when the token is added (``add_special_tokens`` makes it False), as tokenizers decides it;
    ``str(token)`` is its content."""

    __slots__ = ("content", "single_word", "lstrip", "rstrip", "_normalized", "special")

    def __init__(self, content: str, single_word: bool = False, lstrip: bool = False, rstrip: bool = False,
                 normalized: bool | None = None, special: bool = False):
        if not isinstance(content, str):
            raise BertkitError(f"AddedToken content must be a str, got {content!r}")
        self.content, self.single_word, self.lstrip, self.rstrip = content, single_word, lstrip, rstrip
        self._normalized, self.special = normalized, special

    @property
    def normalized(self) -> bool:
        return not self.special if self._normalized is None else self._normalized

    def _fields(self) -> tuple:
        return (self.content, self.single_word, self.lstrip, self.rstrip, self.normalized, self.special)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, AddedToken) and self._fields() == other._fields()

    def __hash__(self) -> int:
        return hash(self.content)

    def __str__(self) -> str:
        return self.content

    def __repr__(self) -> str:
        return (f'AddedToken("{self.content}", rstrip={self.rstrip}, lstrip={self.lstrip}, '
                f"single_word={self.single_word}, normalized={self.normalized}, special={self.special})")

    def __getstate__(self) -> tuple:
        return (self.content, self.single_word, self.lstrip, self.rstrip, self._normalized, self.special)

    def __setstate__(self, state: tuple) -> None:
        self.__init__(*state)


def options_bertkit_lacks(options: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, bool]]:
    """(the options of a token, serialised or an ``AddedToken``'s, that bertkit does not match as transformers would,
    the values it matches them at) given ``options["special"]``; an option left out is at its default."""
    special = bool(options.get("special"))
    wanted = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": not special}
    return {f: options[f] for f, v in wanted.items() if options.get(f, v) != v}, wanted


def unmatched_message(where: str, content: object, special: bool, flags: Mapping[str, Any],
                      wanted: Mapping[str, bool], fix: str) -> str:
    """Why a token with ``flags`` is refused; ``fix`` says what to do, its ``{wanted}`` the values bertkit matches."""
    kind = "special token" if special else "added token"
    return (f"{where}{kind} {content!r} has {' and '.join(f'{f}={str(v).lower()}' for f, v in flags.items())}, which "
            "bertkit does not implement (it matches a special token as written in the raw text, an added one in the "
            "normalized text as add_tokens adds it, inside words too, its offsets covering the token alone), so the "
            "ids or offsets would not be transformers': "
            + fix.format(wanted=" and ".join(f"{f}={str(wanted[f]).lower()}" for f in flags)))


def token_text(token: Any, special: bool) -> tuple[Any, bool]:
    """(the text to add, whether it is special) for a str or an ``AddedToken`` (bertkit's, or tokenizers' read by its
    attributes) added with ``special_tokens=special``; an AddedToken's own ``special`` makes it special too, as in
    transformers. Anything else is returned as it is (the caller names it)."""
    if isinstance(token, str) or not all(hasattr(token, a) for a in ("content", "special", *_OPTIONS)):
        return token, special
    options = {f: getattr(token, f) for f in _OPTIONS}
    if special and not token.special and options["normalized"] and not isinstance(token, AddedToken):
        # tokenizers' AddedToken reads normalized=True both when it was given and when it was left out (then "not
        # special", decided when added): made special by this call, transformers matches the first in the normalized
        # text and the second as written, and nothing tells them apart here
        raise BertkitError(f"{token!r} is made special here, and tokenizers' AddedToken does not say whether its "
                           "normalized=True was given (transformers then matches it in the normalized text) or left "
                           "out (matched as written): pass bertkit's AddedToken (from bertkit import AddedToken), "
                           "or a str, or create it with special=True")
    special = special or bool(token.special)
    given = getattr(token, "_normalized", options["normalized"])  # bertkit's keeps "not given" (None)
    options["normalized"] = not special if given is None else given
    flags, wanted = options_bertkit_lacks({**options, "special": special})
    if flags:
        raise BertkitError(unmatched_message("", token.content, special, flags, wanted,
                                             "add it with {wanted} (transformers then matches it as bertkit does), "
                                             "or as a str"))
    return token.content, special
