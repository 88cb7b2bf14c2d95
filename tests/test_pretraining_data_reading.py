"""Corpus reading for pre-training data: what of a file's bytes reaches the documents (bertkit.data.text)."""

from __future__ import annotations

import pytest

from bertkit.data.text import iter_documents, plan_work_units
from bertkit.tokenization.textfiles import iter_lines


@pytest.mark.parametrize("tail", ["\x00", "\x94", "\u200e", "\ufffd", "\u201d\u200e"])
def test_a_paragraph_ending_in_what_the_tokenizer_deletes_is_prose(tmp_path, tail):
    """Was dropped: prose reading keeps a paragraph that ends like a sentence, and took its last character as it stood,
    so a paragraph ending in a character the tokenizer deletes (a NUL, a left-to-right mark, the U+0094 of a
    Windows-1252 closing quote decoded as Latin-1, a U+FFFD from errors='replace') was dropped, unseen: 124 paragraphs
    (15,993 words) of the shared corpus' pg4658.txt, whose quotes close with U+0094."""
    book = tmp_path / "book.txt"
    book.write_text(f"He spoke to the gods who heard them.{tail}\n\nThey said no more. The end.\n\nChapter II\n",
                    encoding="utf-8")
    assert list(iter_documents(book, "prose")) == [
        [f"He spoke to the gods who heard them.{tail}", "They said no more.", "The end."]]


def test_a_paragraph_of_deleted_characters_alone_or_stray_markup_is_no_prose(tmp_path):
    book = tmp_path / "book.txt"  # a space before closers is no sentence's end: a stray image caption's "]]"
    book.write_text("\x00\u200e\n\nA bicycle, with 500 million produced. ]]\n\nThey said no more. The end.\n",
                    encoding="utf-8")
    assert list(iter_documents(book, "prose")) == [["They said no more.", "The end."]]


@pytest.mark.parametrize("encoding, name", [("utf-16-le", "UTF-16LE"), ("utf-16-be", "UTF-16BE"),
                                            ("utf-32-le", "UTF-32LE"), ("utf-32-be", "UTF-32BE")])
def test_utf16_text_without_a_byte_order_mark_is_refused_naming_how_to_convert_it(tmp_path, encoding, name):
    """Was read: its NUL bytes are valid UTF-8, which the tokenizer deletes, so in the sentences layout no line was
    blank (the file's documents ran together into one), and read as prose ("auto" took it for prose) each paragraph
    ended in a NUL, so the whole file was dropped without a word."""
    path = tmp_path / "saved.txt"
    path.write_bytes("\nFirst document, one sentence.\nAnother one.\n\nSecond document.\nIts end.\n".encode(encoding))
    for call in (lambda: plan_work_units([path], "sentences"), lambda: list(iter_lines(path))):
        with pytest.raises(ValueError, match=rf"saved\.txt is {name} text without a byte-order mark .* \(iconv -f "
                                             rf"{name} -t UTF-8 "):
            call()


def test_utf8_text_with_the_odd_nul_is_read(tmp_path):
    path = tmp_path / "ok.txt"
    path.write_text("Caf\u00e9 na\u00efve r\u00e9sum\u00e9.\x00 Second.\nAnother line \u4e2d\u6587.\n\nNext.\nEnd.\n",
                    encoding="utf-8")
    assert [p.end for u in plan_work_units([path], "sentences") for p in u.parts] == [path.stat().st_size]
    assert list(iter_documents(path, "sentences")) == [
        ["Caf\u00e9 na\u00efve r\u00e9sum\u00e9.\x00 Second.", "Another line \u4e2d\u6587."], ["Next.", "End."]]
