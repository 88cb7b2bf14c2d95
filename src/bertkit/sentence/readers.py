"""``InputExample``: the row of sentence-transformers' legacy ``model.fit`` (its ``sentence_transformers.readers``),
which ``SentenceTransformer.fit`` turns into a dataset's row."""

from __future__ import annotations


class InputExample:
    """One example: its texts, its label (0: none) and an id, as sentence-transformers defines it."""

    def __init__(self, guid: str = "", texts: list[str] | None = None, label: int | float = 0):
        self.guid = guid
        self.texts = texts
        self.label = label

    def __str__(self) -> str:
        return "<InputExample> label: {}, texts: {}".format(str(self.label), "; ".join(self.texts or []))
