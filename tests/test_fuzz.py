"""Property-based tests (hypothesis): the tokenizer on arbitrary Unicode against transformers' fast tokenizer,
and the data readers on random mutations of real files (a parse or a BertkitError, never another exception).

`make test` runs a short budget; `make test-slow` sets BERTKIT_FUZZ_TOKENIZER=100000 and
BERTKIT_FUZZ_READERS=10000 (the counts RESULTS.md reports).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis", reason="hypothesis is a test dependency (pip install -e '.[test]')")
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from bertkit.errors import BertkitError  # noqa: E402
from bertkit.tokenization import BertTokenizer  # noqa: E402
from tokenizer_parity_helpers import hf_reference, sendable  # noqa: E402 (tests/ is on sys.path)

TOKENIZER_EXAMPLES = int(os.environ.get("BERTKIT_FUZZ_TOKENIZER", "300"))
READER_EXAMPLES = int(os.environ.get("BERTKIT_FUZZ_READERS", "60"))
FUZZ = dict(deadline=None, suppress_health_check=list(HealthCheck), derandomize=False, database=None)

# Every code point, surrogates included: the tokenizer takes any Python str.
ANY_CHAR = st.characters(codec=None, exclude_categories=())
# Text shaped like real input more often than uniform code points would be: words, marks, spaces, CJK.
PIECES = st.sampled_from(["the", "Über", "naïve", "do", "n't", "##", "[MASK]", "[SEP]", "中文", "日本語", " ", "  ",
                          "\t", "\n", "\u0301", "\u200b", "\x00", "\ufffd", "e\u0301", "😀", "ﬁ", "İ", "ß", "...", ","])
TEXT = st.one_of(st.text(ANY_CHAR, max_size=40), st.lists(st.one_of(PIECES, st.text(ANY_CHAR, max_size=3)),
                                                          max_size=20).map("".join))


@pytest.fixture(scope="module")
def tokenizers(minilm_dir):
    ours = BertTokenizer.from_pretrained(minilm_dir)
    return ours, hf_reference(minilm_dir / "vocab.txt", do_lower_case=True)


def _check_offsets(a: str, b: str | None, enc: dict) -> None:
    """Offsets index into their own segment's text, in order, and special tokens have (0, 0)."""
    last = {0: 0, 1: 0}
    for (start, end), special, segment in zip(enc["offset_mapping"], enc["special_tokens_mask"],
                                              enc["token_type_ids"]):
        if special:
            assert (start, end) == (0, 0)
            continue
        text = a if segment == 0 else b
        assert 0 <= start <= end <= len(text), (a, b, start, end)
        assert start >= last[segment], (a, b, enc["offset_mapping"])
        last[segment] = start


TRUNCATION = st.sampled_from([None, "longest_first", "only_first", "only_second"])


@settings(max_examples=TOKENIZER_EXAMPLES, **FUZZ)
@given(a=TEXT, b=st.one_of(st.none(), TEXT), truncation=TRUNCATION, max_length=st.integers(4, 40))
def test_tokenizer_never_raises_and_matches_the_fast_tokenizer(tokenizers, a, b, truncation, max_length):
    ours, ref = tokenizers
    kw = {} if truncation is None else {"truncation": truncation, "max_length": max_length}
    if truncation == "only_second" and b is None:
        kw = {"truncation": "only_first", "max_length": max_length}
    try:
        mine = ours(a, b, return_offsets_mapping=True, return_special_tokens_mask=True, **kw)
    except BertkitError as e:  # a request that cannot be met (a pair truncated to fit) is a clear error
        assert "max_length" in str(e) or "truncat" in str(e)
        return
    _check_offsets(a, b, mine)
    if kw:
        assert len(mine["input_ids"]) <= max_length or truncation == "only_second"
    if not (sendable(a) and (b is None or sendable(b))):
        return  # the Rust tokenizer cannot take lone surrogates; ours must only not raise
    try:
        theirs = ref(a, b, return_offsets_mapping=True, return_special_tokens_mask=True, **kw)
    except Exception:  # noqa: BLE001 - the reference refuses some truncation requests: nothing to compare
        return
    assert mine["input_ids"] == theirs["input_ids"], (a, b, kw)
    assert mine["token_type_ids"] == theirs["token_type_ids"]
    assert [tuple(o) for o in mine["offset_mapping"]] == [tuple(o) for o in theirs["offset_mapping"]]
    assert mine["special_tokens_mask"] == theirs["special_tokens_mask"]
    assert (mine.word_ids(), mine.sequence_ids()) == (theirs.word_ids(), theirs.sequence_ids())
    ids = mine["input_ids"]
    for skip, clean in ((False, False), (True, False), (True, True)):
        assert ours.decode(ids, skip_special_tokens=skip, clean_up_tokenization_spaces=clean) == ref.decode(
            ids, skip_special_tokens=skip, clean_up_tokenization_spaces=clean), (a, b, ids, skip, clean)
    assert ours.tokenize(a, b, add_special_tokens=True) == ref.tokenize(a, b, add_special_tokens=True)


# ---------------------------------------------------------------- readers on mutated real files


def _head(path: Path, lines: int) -> bytes:
    with open(path, "rb") as f:
        return b"".join(f.readline() for _ in range(lines))


@pytest.fixture(scope="module")
def samples(data_dir):
    squad = (data_dir / "squad" / "dev-v1.1.json").read_bytes()
    end = squad.index(b'"title"', 2000)  # the first article, cut at the second article's start, closed again
    first_article = squad[: squad.rindex(b"{", 0, end)].rstrip().rstrip(b",") + b"]}"
    return {
        "sst2": _head(data_dir / "glue" / "SST-2" / "dev.tsv", 40),
        "stsb": _head(data_dir / "glue" / "STS-B" / "dev.tsv", 40),
        "mrpc": _head(data_dir / "glue" / "MRPC" / "dev.tsv", 30),
        "conll": _head(data_dir / "conll2003" / "valid.txt", 80),
        "squad": first_article,
    }


MUTATION = st.one_of(
    st.tuples(st.just("bytes"), st.integers(0, 10**6), st.binary(min_size=1, max_size=4)),
    st.tuples(st.just("insert"), st.integers(0, 10**6), st.sampled_from([b"\t", b"\n", b"\n\n", b" ", b'"', b"{",
                                                                         b"\r", b"\xff", b"nan", b"-1", b"\x00"])),
    st.tuples(st.just("delete"), st.integers(0, 10**6), st.integers(1, 40)),
    st.tuples(st.just("truncate"), st.integers(0, 10**6), st.just(b"")),
    st.tuples(st.just("line"), st.integers(0, 10**6), st.sampled_from(["drop", "dup", "swap", "empty"])),
)


def _mutate(data: bytes, mutations) -> bytes:
    for kind, pos, arg in mutations:
        pos = pos % (len(data) + 1)
        if kind == "bytes":
            data = data[:pos] + arg + data[pos + len(arg):]
        elif kind == "insert":
            data = data[:pos] + arg + data[pos:]
        elif kind == "delete":
            data = data[:pos] + data[pos + arg:]
        elif kind == "truncate":
            data = data[:pos]
        else:
            lines = data.split(b"\n")
            i = pos % max(1, len(lines))
            if arg == "drop":
                del lines[i]
            elif arg == "dup":
                lines.insert(i, lines[i] if lines else b"")
            elif arg == "swap" and lines:
                lines[i] = b"\t".join(reversed(lines[i].split(b"\t")))
            else:
                lines.insert(i, b"")
            data = b"\n".join(lines)
    return data


def _read(kind: str, root: Path, data: bytes):
    from bertkit.tasks import glue, ner, squad

    if kind in ("sst2", "stsb", "mrpc"):
        folder = {"sst2": "SST-2", "stsb": "STS-B", "mrpc": "MRPC"}[kind]
        (root / folder).mkdir(exist_ok=True)
        (root / folder / "dev.tsv").write_bytes(data)
        return glue.read_glue(kind, root, "dev")
    if kind == "conll":
        (root / "valid.txt").write_bytes(data)
        return ner.read_conll(root / "valid.txt")
    (root / "dev.json").write_bytes(data)
    return squad.read_squad(root / "dev.json")


@pytest.mark.parametrize("kind", ["sst2", "stsb", "mrpc", "conll", "squad"])
def test_readers_parse_or_explain_every_mutation(samples, kind):
    _read(kind, Path(tempfile.mkdtemp()), samples[kind])  # the unmutated sample parses

    @settings(max_examples=READER_EXAMPLES, **FUZZ)
    @given(mutations=st.lists(MUTATION, min_size=1, max_size=4))
    def run(mutations):
        with tempfile.TemporaryDirectory() as root:
            try:
                _read(kind, Path(root), _mutate(samples[kind], mutations))
            except BertkitError as e:
                assert str(e)  # a clear error; any other exception type fails the test

    run()
