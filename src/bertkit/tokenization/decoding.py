"""Ids -> text: the WordPiece decoder (tokenizers' ``decoders.WordPiece``) and transformers' clean-up of the decoded
string, which ``BertTokenizer.decode`` and ``convert_tokens_to_string`` apply."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# WordPiece decoder clean-up (tokenizers' `decoders::wordpiece::cleanup`), applied to each token with
# the space that joins it to the previous one.
_CLEANUP = (
    (" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
    (" do not", " don't"), (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"),
)  # fmt: skip
# transformers' `clean_up_tokenization`, applied to the whole decoded string when
# clean_up_tokenization_spaces is on: the same but for " do not".
_CLEANUP_TEXT = tuple(pair for pair in _CLEANUP if pair[0] != " do not")


def wordpiece_text(tokens: Sequence[str]) -> str:
    """Token strings -> text: a ``##`` piece joins the previous token (the first token keeps its ``##``), the others
    get a space, and the space before ``. ? ! ,`` and a few contractions is dropped token by token."""
    pieces: list[str] = []
    for token in tokens:
        if pieces:
            token = token[2:] if token.startswith("##") else " " + token
        for dirty, clean in _CLEANUP:
            token = token.replace(dirty, clean)
        pieces.append(token)
    return "".join(pieces)


def cleaned_up(text: str) -> str:
    """transformers' ``clean_up_tokenization`` of a decoded string (``clean_up_tokenization_spaces``)."""
    for dirty, clean in _CLEANUP_TEXT:
        text = text.replace(dirty, clean)
    return text


def as_id_list(ids: Any) -> list[int]:
    """A flat list of ints from a list, tuple, 1-D tensor or 1-D array; anything else in it is a TypeError (a float
    id is not cut to an integer: transformers' decode refuses it too)."""
    if isinstance(ids, Mapping) and "input_ids" in ids:  # an encoding, as tok(text): transformers decodes its ids
        ids = ids["input_ids"]
    if hasattr(ids, "tolist"):
        ids = ids.tolist()
    if isinstance(ids, int):
        return [ids]
    ids = list(ids)
    if not all(isinstance(i, int) for i in ids):
        # numpy integers and 0-d tensors (``list(array)``, ``list(tensor)``) are ids too, as transformers reads them
        ids = [i.tolist() if hasattr(i, "tolist") else i for i in ids]
        bad = next((k for k, i in enumerate(ids) if not isinstance(i, int)), None)
        if bad is not None and isinstance(ids[bad], (list, tuple)):
            raise TypeError(
                f"expected a flat sequence of token ids, got a {type(ids[bad]).__name__} at position {bad}; for a "
                "batch of sequences (a list of lists, a 2-D tensor) use batch_decode, which transformers 5's decode "
                "also does"
            )
        if bad is not None:
            raise TypeError(f"token ids are integers: got {ids[bad]!r} ({type(ids[bad]).__name__}) at position {bad}; "
                            "pass integer ids (a float tensor's .long())")
    return ids
