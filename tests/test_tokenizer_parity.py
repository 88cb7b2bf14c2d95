"""Parity of bertkit's BertTokenizer with Hugging Face's BertTokenizerFast (the Rust `tokenizers` pipeline).

Fast checks: every assigned Unicode code point through the basic tokenizer, hand-picked edge cases, random
strings, truncation arithmetic, padding/tensors, decode, and a deterministic 0.1% sample of every file in
the shared data (bench/tokenizer_parity_sweep.py --sample 1000), in uncased and cased mode.
Slow (`-m slow`): the same sweep over 1% and over every line of every file, and the code points of the
unassigned and private-use planes beyond the first and last block of each.

The reference must be built with the vocabulary passed as `vocab=` under transformers 5 (it silently
ignores `vocab_file=` there and keeps a 5-token vocabulary); `hf_reference`, in tokenizer_parity_helpers.py,
checks it loaded.
"""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

from bertkit.tokenization import BasicTokenizer, BertTokenizer
from tokenizer_parity_helpers import hf_reference, sendable  # tests/ is on sys.path under pytest

REPO = Path(__file__).resolve().parents[1]
SWEEP = REPO / "bench" / "tokenizer_parity_sweep.py"
MODES = {"uncased": True, "cased": False}

EDGE_CASES = [
    "",
    " ",
    "\t\n\r  \u3000\u00a0",
    "Hello, world!",
    "HELLO World hello",
    "Héllo wörld, CAFÉ naïve façade Ångström",
    "İstanbul ΟΔΟΣ Σίσυφος ß ǅ ﬁ Ⅻ",
    "e\u0301 a\u0308\u0304 x\u0327\u0301y \u0301alone",
    "中文字符 and 日本語のテキスト、한국어 텍스트",
    "𠀀𪚥 U+2B820:\U0002b820\U0002b91f\U0002b920",
    "emoji 🥰👍🏽 👨‍👩‍👧 ❤️ 🇫🇷",
    "ctrl\x00NUL\x01\x07bell\x1b[0m \x7f\x85nel \x0bvt\x0cff \x1cfs\x1f",
    "zero\u200bwidth\u200c\u200d join\ufeffbom \u00adsoft\u00adhyphen",
    "bad\ufffdchar \ufffd\ufffd",
    "line\u2028sep\u2029para",
    "private\ue000use \U000f0000",
    "a" * 100,
    "a" * 101,
    "x" + "é" * 100,
    "supercalifragilisticexpialidocious antidisestablishmentarianism",
    "[CLS] [SEP] [PAD] [MASK] [UNK]",
    "The [MASK] sat on the mat.",
    "x[MASK]y[MASK][MASK] [mask] [Mask] [MASK",
    "[[MASK]] ([SEP]) [CLS]word",
    "don't won't it's I'm we've they're",
    "$100 + 5% = <html> ^_^ `code` a|b ~tilde @user #tag",
    "“quotes” ‘single’ — en–dash … «guillemets» ¿¡ ·",
    "U.S.A. e.g. 3.14159 1,000,000 12:30pm 2019-08-14",
    "   leading and trailing spaces   ",
    "tab\tseparated\tvalues",
    "ǅungla Ǉ ǈ ǉ Ǌ",
    "Ⓐⓑ ① ㈱ ㎞ ＡＢＣ ｆｕｌｌｗｉｄｔｈ",
    "ﬀ ﬃ ẞ ϴ ẛ̣",
    "\u037e greek question \u0387 ano teleia \u1fee\u1fef",
    "\u166d \u111c9 \u1734 \u2e43 dash",
    "Ὀδυσσεύς ᾈ ᾯ",
    "\ud800 lone surrogate",
]


@pytest.fixture(scope="module")
def vocab_file(minilm_dir: Path) -> Path:
    path = minilm_dir / "vocab.txt"
    if not path.is_file():
        pytest.skip(f"{path} absent: run `make model`")
    return path


@pytest.fixture(scope="module", params=list(MODES))
def pair(request, vocab_file: Path) -> tuple[BertTokenizer, object]:
    lower = MODES[request.param]
    return BertTokenizer(vocab_file, do_lower_case=lower), hf_reference(vocab_file, lower)


def _assert_same(ours: BertTokenizer, ref, a, b=None, **kw) -> None:
    mine = ours(a, b, return_offsets_mapping=True, return_special_tokens_mask=True, **kw)
    theirs = ref(a, b, return_offsets_mapping=True, return_special_tokens_mask=True, **kw)
    for key in ("input_ids", "token_type_ids", "attention_mask", "special_tokens_mask"):
        assert mine[key] == theirs[key], (key, a, b)
    want = theirs["offset_mapping"]
    want = [[tuple(o) for o in row] for row in want] if isinstance(a, list) else [tuple(o) for o in want]
    assert mine["offset_mapping"] == want, ("offsets", a, b)


# ----------------------------------------------------------------------------------------------------
# Character level
# ----------------------------------------------------------------------------------------------------


BLOCK = 4096
ASSIGNED_PLANES = (0, 1, 2, 3, 14)  # every code point Unicode assigns (to 16.0) outside private use lies here


def _blocks(every_plane_in_full: bool) -> list[int]:
    """First code points of the 4096-wide blocks to check: planes 0-3 and 14 in full, and of the unassigned
    planes 4-13 and the private-use planes 15-16 (one category each) the first and last block, unless
    ``every_plane_in_full``."""
    firsts = range(0, 0x110000, BLOCK)
    if every_plane_in_full:
        return list(firsts)
    return [f for f in firsts if f >> 16 in ASSIGNED_PLANES or f % 0x10000 in (0, 0x10000 - BLOCK)]


def _check_code_points(lower: bool, firsts: list[int]) -> None:
    """Each code point of the blocks between two letters: same words as BertNormalizer + BertPreTokenizer.

    Checked 4096 code points at a time ("a\u0000b a\u0001b ..."; letters and spaces keep the characters
    from interacting), then one by one within a block that differs, to name the culprits.
    """
    tokenizers = pytest.importorskip("tokenizers", reason="tokenizers is the parity reference")
    normalizer = tokenizers.normalizers.BertNormalizer(lowercase=lower, strip_accents=None)
    pre = tokenizers.pre_tokenizers.BertPreTokenizer()
    ours = BasicTokenizer(do_lower_case=lower)

    def theirs(text: str) -> list[str]:
        return [w for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(text))]

    bad = []
    for first in firsts:
        cps = [cp for cp in range(first, first + BLOCK) if not 0xD800 <= cp <= 0xDFFF]
        if ours.tokenize(" ".join(f"a{chr(cp)}b" for cp in cps)) != theirs(
            " ".join(f"a{chr(cp)}b" for cp in cps)
        ):
            bad += [hex(cp) for cp in cps if ours.tokenize(f"a{chr(cp)}b") != theirs(f"a{chr(cp)}b")]
    assert not bad, f"{len(bad)} code points differ, e.g. {bad[:20]}"


@pytest.mark.parametrize("lower", [True, pytest.param(False, marks=pytest.mark.slow)], ids=["uncased", "cased"])
def test_every_assigned_code_point_basic_tokenizer(lower: bool) -> None:
    """Every code point of planes 0-3 and 14 (all that Unicode assigns), and the first and last 4096 of each
    unassigned or private-use plane."""
    blocks = _blocks(every_plane_in_full=False)
    assert len(blocks) == 5 * 16 + 12 * 2
    _check_code_points(lower, blocks)


@pytest.mark.slow
@pytest.mark.parametrize("lower", [True, False], ids=["uncased", "cased"])
def test_every_code_point_basic_tokenizer(lower: bool) -> None:
    """Every code point from U+0000 to U+10FFFF (surrogates aside)."""
    _check_code_points(lower, _blocks(every_plane_in_full=True))


def test_surrogates_are_dropped() -> None:
    # Hugging Face cannot take them at all (Rust str); dropping them like other Cs characters is our choice.
    assert BasicTokenizer().tokenize("a\ud800b \udfff") == ["ab"]


# ----------------------------------------------------------------------------------------------------
# Text level
# ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text", [t for t in EDGE_CASES if sendable(t)], ids=range(sum(map(sendable, EDGE_CASES)))
)
def test_edge_case(pair, text: str) -> None:
    ours, ref = pair
    _assert_same(ours, ref, text)
    assert ours.tokenize(text) == ref.tokenize(text)
    for skip in (True, False):
        ids = ref(text)["input_ids"]
        assert ours.decode(ids, skip_special_tokens=skip) == ref.decode(ids, skip_special_tokens=skip)


def test_edge_cases_as_pairs_and_batch(pair) -> None:
    ours, ref = pair
    texts = [t for t in EDGE_CASES if sendable(t)]
    _assert_same(ours, ref, texts, texts[::-1])
    _assert_same(ours, ref, texts, padding=True)
    _assert_same(
        ours, ref, texts, texts[1:] + texts[:1], padding="max_length", max_length=200, truncation=True
    )


def _random_text(rng: random.Random) -> str:
    alphabet = (
        "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
        " \t\n\r.,;:!?'\"()[]{}-_/\\@#$%^&*+=<>|~`"
        "éèêëÉÀÂÄÖÜßñÑçÇåÅøØæÆœŒıİ" "\u0301\u0308\u0327\u0300\u0345\u20dd"
        "ΑΒΓΔΣσςάέίόύώ" "АБВгдеёЖ" "中文字日本語한국어テスト" "“”‘’—–…«»¿¡·" "🥰👍🏽❤️"
        "\x00\x01\x0b\x0c\x1c\x7f\x85\u200b\u200d\ufeff\ufffd\u2028\u3000\u00a0\u00ad"
        "ǅǈǋǲ" "ﬁﬀ" "①Ⓐ" "\u037e\u1fee" "\u2e43\u166d\u0f39\U0001d165"
    )  # fmt: skip
    pieces = ["[MASK]", "[SEP]", "[mask]", "unaffable", "hello", "##ing", "a" * 101]
    out = []
    for _ in range(rng.randint(0, 40)):
        if rng.random() < 0.05:
            out.append(rng.choice(pieces))
        else:
            out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12))))
        out.append(rng.choice([" ", "", "  ", "\n"]))
    return "".join(out)


def test_random_strings(pair) -> None:
    ours, ref = pair
    rng = random.Random(1234)
    texts = [_random_text(rng) for _ in range(1500)]
    _assert_same(ours, ref, texts)
    assert ours(texts)["input_ids"] == ref(texts)["input_ids"]  # the path without offsets
    _assert_same(ours, ref, texts[:750], texts[750:])
    for skip in (True, False):
        ids = ref(texts[:300])["input_ids"]
        assert ours.batch_decode(ids, skip_special_tokens=skip) == ref.batch_decode(
            ids, skip_special_tokens=skip
        )


def test_combining_mark_sequences(pair) -> None:
    """Runs of combining marks, which NFD reorders (uncased): ids and offsets as Hugging Face."""
    ours, ref = pair
    marks = [chr(c) for c in range(0x300, 0x370)] + list(
        "\u0f39\U0001d165\U0001d16d\u0345\u20dd\u05b0\u0651\u093c\u3099"
    )
    bases = list("aeoAEßİı,.' \t\x00\u200b") + [
        "é",
        "ẹ",
        "ǖ",
        "ώ",
        "\u0344",
        "\u0958",
        "한",
        "\U00011938",
        "中",
        "\ufa10",
        "[MASK]",
    ]
    rng = random.Random(5)
    texts = [
        "".join(
            rng.choice(marks) if rng.random() < 0.5 else rng.choice(bases) for _ in range(rng.randint(0, 25))
        )
        for _ in range(3000)
    ]
    _assert_same(ours, ref, texts)
    assert ours(texts)["input_ids"] == ref(texts)["input_ids"]
    assert [ours.tokenize(t) for t in texts[:500]] == [ref.tokenize(t) for t in texts[:500]]
    basic, backend = BasicTokenizer(do_lower_case=ours.do_lower_case), ref.backend_tokenizer
    words = [
        [w for w, _ in backend.pre_tokenizer.pre_tokenize_str(backend.normalizer.normalize_str(t))]
        for t in texts
    ]
    assert [basic.tokenize(t) for t in texts] == words


# every combination; make test keeps two that each differ from the checkpoint's in every option it can (uncased
# keeping accents and splitting no CJK, cased stripping accents), the other ten run in make test-slow
_OPTIONS = [(lower, strip, chinese) for lower in (True, False) for strip in (True, False, None) for chinese in (True, False)]
_OPTIONS_IN_MAKE_TEST = {(True, False, False), (False, True, False)}


@pytest.mark.parametrize(
    ("lower", "strip", "chinese"),
    [o if o in _OPTIONS_IN_MAKE_TEST else pytest.param(*o, marks=pytest.mark.slow) for o in _OPTIONS],
)
def test_options_other_than_the_checkpoints(vocab_file: Path, lower: bool, strip: bool | None, chinese: bool) -> None:
    """strip_accents / tokenize_chinese_chars combinations the minilm config does not use."""
    normalizers = pytest.importorskip("tokenizers.normalizers")
    rng = random.Random(7)
    texts = [_random_text(rng) for _ in range(300)] + [t for t in EDGE_CASES if sendable(t)]
    ref = hf_reference(vocab_file, lower)
    ref.backend_tokenizer.normalizer = normalizers.BertNormalizer(
        lowercase=lower, strip_accents=strip, handle_chinese_chars=chinese
    )
    ours = BertTokenizer(vocab_file, do_lower_case=lower, strip_accents=strip, tokenize_chinese_chars=chinese)
    _assert_same(ours, ref, texts)


# ----------------------------------------------------------------------------------------------------
# Truncation and padding
# ----------------------------------------------------------------------------------------------------


def test_truncation_arithmetic(pair) -> None:
    """Random lengths, budgets and strategies: same kept tokens, and an error exactly where HF errors."""
    ours, ref = pair
    rng = random.Random(99)
    for _ in range(1500):
        len_a, len_b = rng.randint(0, 12), rng.choice([None, rng.randint(0, 12)])
        a = " ".join(f"a{i}" if i % 3 else "b" for i in range(len_a))
        b = None if len_b is None else " ".join("c" for _ in range(len_b))
        strategy = rng.choice(["longest_first", "only_first", "only_second", True])
        max_length = rng.randint(2 if b is None else 3, 30)
        try:
            want = ref(a, b, max_length=max_length, truncation=strategy, return_offsets_mapping=True)
        except Exception as e:  # tokenizers raises a bare Exception("Truncation error: ...")
            assert "Truncation error" in str(e)
            with pytest.raises(ValueError):
                ours(a, b, max_length=max_length, truncation=strategy)
            continue
        got = ours(a, b, max_length=max_length, truncation=strategy, return_offsets_mapping=True)
        assert got["input_ids"] == want["input_ids"], (len_a, len_b, max_length, strategy)
        assert got["token_type_ids"] == want["token_type_ids"]
        assert got["offset_mapping"] == [tuple(o) for o in want["offset_mapping"]]


def test_max_length_without_truncation_flag_truncates_like_hf(pair) -> None:
    ours, ref = pair
    text = "one two three four five six seven"
    assert ours(text, max_length=5)["input_ids"] == ref(text, max_length=5)["input_ids"]
    kw = {"max_length": 5, "padding": "max_length"}  # padding on: HF does not truncate
    assert ours(text, **kw)["input_ids"] == ref(text, **kw)["input_ids"]


@pytest.mark.parametrize("tensors", ["pt", "np"])
def test_padded_tensors(pair, tensors: str) -> None:
    ours, ref = pair
    texts = ["a short one", "a rather longer sentence, with a comma", ""]
    pairs_ = ["x", "", "why not?"]
    kw = {"padding": "max_length", "max_length": 24, "truncation": True, "return_tensors": tensors,
          "return_offsets_mapping": True, "return_special_tokens_mask": True}  # fmt: skip
    mine, theirs = ours(texts, pairs_, **kw), ref(texts, pairs_, **kw)
    assert list(mine) == list(theirs)
    for key in mine:
        assert mine[key].shape == theirs[key].shape, key
        assert mine[key].tolist() == theirs[key].tolist(), key
        assert str(mine[key].dtype).endswith("int64"), key


# ----------------------------------------------------------------------------------------------------
# Real data
# ----------------------------------------------------------------------------------------------------


def _run_sweep(model: Path, data: Path, every: int) -> dict:
    """bench/tokenizer_parity_sweep.py's main() in this process (its one JSON line is the returned dict)."""
    spec = importlib.util.spec_from_file_location("tokenizer_parity_sweep", SWEEP)
    sweep = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sweep)
    result = sweep.main(["--model", str(model), "--data", str(data), "--sample", str(every)])
    problems = {
        mode: {g: s["examples"] for g, s in m["groups"].items() if s["examples"]} | {"truncation": m["truncation"]["examples"]}
        for mode, m in result["modes"].items()
    }  # fmt: skip
    assert result["mismatches"] == 0, json.dumps(problems, ensure_ascii=False)[:3000]  # the script's exit status
    return result


@pytest.mark.slow  # 4 s; make test keeps test_random_strings, test_combining_mark_sequences and test_edge_case
def test_data_sample(vocab_file: Path, data_dir: Path) -> None:
    """Every 1000th line of every data file (about 1,900 texts and pairs per mode), every file group present."""
    result = _run_sweep(vocab_file.parent, data_dir, 1000)
    for mode in MODES:
        assert result["modes"][mode]["lines"] > 1500
        assert result["modes"][mode]["truncation_checks"] > 150
        assert all(g["texts"] > 0 for g in result["modes"][mode]["groups"].values())


@pytest.mark.slow
def test_data_one_percent_sample(vocab_file: Path, data_dir: Path) -> None:
    """Every 100th line of every data file (about 19,000 texts and pairs per mode)."""
    result = _run_sweep(vocab_file.parent, data_dir, 100)
    for mode in MODES:
        assert result["modes"][mode]["lines"] > 15000
        assert result["modes"][mode]["truncation_checks"] > 1500


@pytest.mark.slow
def test_data_full_sweep(vocab_file: Path, data_dir: Path) -> None:
    """Every line of every data file, both modes (about 10 minutes on 2 cores)."""
    result = _run_sweep(vocab_file.parent, data_dir, 1)
    for mode in MODES:
        assert result["modes"][mode]["lines"] > 1_500_000
