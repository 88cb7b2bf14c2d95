"""WordPiece vocabulary learning (bertkit.tokenization.trainer): exact vocabularies on tiny texts, the same as
tokenizers' trainer, round trip through BertTokenizer and transformers, error cases, and a check on real text when the
corpus is present."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from bertkit.tokenization import BasicTokenizer, BertTokenizer
from bertkit.tokenization.trainer import (
    SPECIAL_TOKENS,
    count_words,
    learn_wordpiece,
    train_wordpiece_vocab,
)

CORPUS = Path("/work/shared/data/corpus")


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def test_exact_vocab_on_a_tiny_text(tmp_path):
    # "ab" x5 and "abc" x3 (lower-cased): pairs (a, ##b) = 8 and (##b, ##c) = 3. The first merge makes
    # "ab"; "abc" is then [ab, ##c] and the second merge makes "abc"; then no pair is left.
    f = write(tmp_path, "t.txt", "ab AB ab\nab ab abc\n\nabc ABC\n")
    vocab = train_wordpiece_vocab([f], vocab_size=100, min_frequency=1, num_workers=1, progress=False)
    assert vocab == [*SPECIAL_TOKENS, "a", "b", "c", "##b", "##c", "ab", "abc"]


def test_alphabet_limit_drops_rare_characters_and_their_words():
    counts = {"ab": 5, "abc": 3, "zq": 1, "q": 1}
    vocab = learn_wordpiece(counts, vocab_size=100, min_frequency=1, limit_alphabet=3)
    assert vocab == [*SPECIAL_TOKENS, "a", "b", "c", "##b", "##c", "ab", "abc"]
    vocab = learn_wordpiece(counts, vocab_size=100, min_frequency=1, limit_alphabet=5)
    assert vocab == [*SPECIAL_TOKENS, "a", "b", "c", "q", "z", "##b", "##c", "##q", "ab", "abc", "zq"]


def test_size_and_min_frequency_are_respected(tmp_path):
    f = write(tmp_path, "t.txt", "ab AB ab\nab ab abc\n\nabc ABC\n")
    assert train_wordpiece_vocab([f], 11, 1, num_workers=1, progress=False)[-1] == "ab"
    assert len(train_wordpiece_vocab([f], 11, 1, num_workers=1, progress=False)) == 11
    # (##b, ##c) occurs 3 times: min_frequency 4 stops before it, 3 allows it.
    assert "abc" not in train_wordpiece_vocab([f], 100, 4, num_workers=1, progress=False)
    assert "abc" in train_wordpiece_vocab([f], 100, 3, num_workers=1, progress=False)
    with pytest.raises(ValueError, match="vocab_size 8 is smaller"):
        train_wordpiece_vocab([f], 8, 1, num_workers=1, progress=False)


def test_frequent_words_become_whole_tokens_and_rare_ones_do_not(tmp_path):
    text = "The cat sat on the mat, and the dog sat too.\n" * 40 + "A zyx appeared.\nzyx!\n"
    f = write(tmp_path, "t.txt", text)
    vocab = train_wordpiece_vocab([f], vocab_size=60, min_frequency=3, num_workers=1, progress=False)
    assert vocab[:5] == list(SPECIAL_TOKENS)
    assert len(vocab) == len(set(vocab)) <= 60
    for word in ["the", "cat", "sat", "on", "mat", "and", "dog", "too"]:
        assert word in vocab
    # "zyx" occurs twice: its pairs are below min_frequency 3, so it stays in characters.
    assert "zyx" not in vocab and "zy" not in vocab and "##yx" not in vocab
    assert {"z", "##y", "##x"} <= set(vocab)
    # Punctuation is always a word of its own (basic tokenizer): no "##," continuation.
    assert "," in vocab and "##," not in vocab


def test_cased_keeps_case(tmp_path):
    f = write(tmp_path, "t.txt", "Paris Paris paris\n" * 5)
    uncased = train_wordpiece_vocab([f], 100, 2, lowercase=True, num_workers=1, progress=False)
    cased = train_wordpiece_vocab([f], 100, 2, lowercase=False, num_workers=1, progress=False)
    assert "paris" in uncased and "Paris" not in uncased and "P" not in uncased
    assert {"Paris", "paris"} <= set(cased)


def test_round_trip_through_bert_tokenizer(tmp_path):
    text = "unbelievable believable believe\nbelieve believer unbelievable\n" * 10
    f = write(tmp_path, "t.txt", text)
    vocab = train_wordpiece_vocab([f], vocab_size=40, min_frequency=2, num_workers=1, progress=False)
    BertTokenizer(vocab, do_lower_case=True).save_pretrained(tmp_path / "vocab")
    tok = BertTokenizer.from_pretrained(tmp_path / "vocab")
    assert [tok.convert_ids_to_tokens(i) for i in range(len(vocab))] == vocab
    assert tok.do_lower_case
    assert tok.tokenize("Believe UNBELIEVABLE believable") == ["believe", "unbelievable", "believable"]
    # Neither "x" nor "s" occurs in the text: a word holding one is unknown.
    assert tok.tokenize("believex believers") == ["[UNK]", "[UNK]"]


def test_one_path_is_one_file_as_tokenizers_takes_it(tmp_path):
    # Was: a str was read as its characters ("/ is a directory: pass the files in it"), a Path was a TypeError; tokenizers'
    # BertWordPieceTokenizer.train(files="corpus.txt") takes one path.
    f = write(tmp_path, "t.txt", "ab AB ab\nab ab abc\n\nabc ABC\n")
    expected = [*SPECIAL_TOKENS, "a", "b", "c", "##b", "##c", "ab", "abc"]
    for one in (str(f), f):
        assert train_wordpiece_vocab(one, vocab_size=100, min_frequency=1, num_workers=1, progress=False) == expected


@pytest.mark.parametrize("name, content", [("corpus.jsonl", '{"text": "the cat sat"}\n{"text": "a dog ran"}\n'),
                                           ("corpus.tsv", "id\ttext\n1\tthe cat sat\n")])
def test_a_corpus_file_of_records_is_refused_not_learnt_with_its_syntax(tmp_path, name, content):
    """Was: a JSON lines or TSV corpus (the datasets export, MS MARCO's collection.tsv) read line by line as text:
    '{', '}', '"', ':' and 'text' learnt as words, the ids as numbers, without a word; now refused, named, as
    create-pretraining-data (which reads its files the same way) and int8 calibration refuse it."""
    from bertkit.data.pretraining import create_pretraining_data

    path = write(tmp_path, name, content)
    write(tmp_path, "plain.txt", "the cat sat\n")
    message = (rf"corpus file .*{name.replace('.', '[.]')} is a {name[7:]} file, whose lines are records .* read as "
               r"plain text, line by line: write the texts to a \.txt file \(of JSON lines: jq -r \.text FILE")
    for files in ([path], str(tmp_path / "*")):  # named, or matched by a pattern
        with pytest.raises(ValueError, match=message):
            train_wordpiece_vocab(files, vocab_size=100, num_workers=1, progress=False)
    with pytest.raises(ValueError, match=message):
        create_pretraining_data([path], BertTokenizer(list(SPECIAL_TOKENS) + ["the"]), tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == [name, "plain.txt"]


def test_parallel_counting_equals_serial(tmp_path):
    files = [write(tmp_path, f"{i}.txt", f"word{i} shared text, file {i}.\n" * (i + 2)) for i in range(4)]
    serial = count_words(files, num_workers=1)
    assert serial == count_words(files, num_workers=2)
    assert serial["shared"] == 2 + 3 + 4 + 5 and serial["word3"] == 5 and serial[","] == 14


def test_errors(tmp_path):
    with pytest.raises(ValueError, match="no input files"):
        train_wordpiece_vocab([], 100)
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        train_wordpiece_vocab([tmp_path / "missing.txt"], 100)
    empty = write(tmp_path, "empty.txt", "\n  \n")
    with pytest.raises(ValueError, match="no words found"):
        train_wordpiece_vocab([empty], 100, num_workers=1, progress=False)
    bad = write(tmp_path, "bad.txt", b"fine line\nbad \xff byte\n")
    with pytest.raises(ValueError, match=r"bad\.txt: line 2 \(byte offset 14\) is not valid UTF-8"):
        train_wordpiece_vocab([bad], 100, num_workers=1, progress=False)
    vocab = train_wordpiece_vocab([bad], 100, 1, errors="replace", num_workers=1, progress=False)
    assert "byte" in vocab


@pytest.mark.skipif(not (CORPUS / "wikipedia").is_dir(), reason="shared corpus not present")
def test_real_text_vocab(tmp_path):
    files = sorted((CORPUS / "wikipedia").glob("*.md"))[:20]
    vocab = train_wordpiece_vocab(files, vocab_size=3000, min_frequency=2, num_workers=1, progress=False)
    assert len(vocab) == 3000 and vocab[:5] == list(SPECIAL_TOKENS)
    for word in ["the", "of", "and", "was", "football", "season", "##s", "##ing", "##ed"]:
        assert word in vocab, word
    tok = BertTokenizer(vocab)
    text = (CORPUS / "wikipedia" / files[0].name).read_text(encoding="utf-8")[:5000]
    pieces = tok.tokenize(text)
    words = len(BasicTokenizer().tokenize(text))
    # A 3,000-entry vocabulary on its own training text: few pieces per word, no unknowns.
    assert 1.0 <= len(pieces) / words < 1.35
    assert "[UNK]" not in pieces


def test_words_are_split_where_the_tokenizer_splits_them(tmp_path):
    # Was: lines were split with `str.split()`, which also splits at \x0b \x0c \x1c-\x1f \x85; BERT (and the tokenizer
    # that uses the vocabulary, and tokenizers' trainer) deletes them as control characters: "foo\x0cbar" is one word.
    f = write(tmp_path, "t.txt", "foo\x0cbar foo\x0bbar ab\x1cc ab\x85c\n")
    assert count_words([f], num_workers=1) == {"foobar": 2, "abc": 2}
    vocab = train_wordpiece_vocab([f], 100, 2, num_workers=1, progress=False)
    # As tokenizers' WordPieceTrainer learns it from the same text, given the order of the "##" entries.
    assert vocab[len(SPECIAL_TOKENS):] == ["a", "b", "c", "f", "o", "r", "##a", "##b", "##c", "##o", "##r", "ab", "fo",
                                           "##ar", "##bar", "##obar", "abc", "foobar"]
    assert BertTokenizer(vocab).tokenize("foo\x0cbar ab\x1cc") == ["foobar", "abc"]


@pytest.mark.parametrize("kwargs, message", [
    ({"vocab_size": 5}, "vocab_size 5 leaves no room for characters beside the 5 special tokens"),
    ({"min_frequency": 0}, "min_frequency must be at least 1, got 0"),
    ({"limit_alphabet": 0}, "limit_alphabet must be at least 1, got 0"),
])
def test_bad_settings_are_refused_before_the_files_are_read(tmp_path, kwargs, message):
    # Was: refused only after counting every word of the corpus (minutes on a large one). The file is not UTF-8, so
    # reading it would raise another error first.
    bad = write(tmp_path, "bad.txt", b"\xff\n")
    with pytest.raises(ValueError, match=message):
        train_wordpiece_vocab([bad], **{"vocab_size": 100, **kwargs}, num_workers=1, progress=False)


def test_same_vocabulary_as_tokenizers_and_the_saved_directory_loads_in_transformers(tmp_path):
    from tokenizers import BertWordPieceTokenizer
    from transformers import BertTokenizerFast

    # Sennrich et al.'s example. tokenizers numbers the "##c" entries in hash-map order (ties between pairs go to
    # the smaller ids); here every tie is decided the same in any order, so the merges are comparable exactly.
    f = write(tmp_path, "t.txt", "low " * 5 + "lower " * 2 + "newest " * 6 + "Widest " * 3 + "\n")
    vocab = train_wordpiece_vocab([f], 100, 2, num_workers=1, progress=False)
    ref = BertWordPieceTokenizer(lowercase=True)
    ref.train([str(f)], vocab_size=100, min_frequency=2, limit_alphabet=1000, show_progress=False)
    ref_vocab = sorted(ref.get_vocab(), key=ref.get_vocab().get)
    chars = [t for t in vocab if t.startswith("##") and len(t) == 3]
    assert vocab == [*SPECIAL_TOKENS, *"deilnorstw", *chars, "##es", "##est", "lo", "low", "ne", "##west", "newest",
                     "wi", "##dest", "widest", "##er", "lower"]
    assert chars == sorted(t for t in ref_vocab if t.startswith("##") and len(t) == 3)
    assert [t for t in vocab if t not in chars] == [t for t in ref_vocab if t not in chars]

    BertTokenizer(vocab, do_lower_case=True).save_pretrained(tmp_path / "tok")
    held_out = ["The newest widest lowest", "LOWER, newer; widow!", "wonder low-est"]
    ids = BertTokenizer.from_pretrained(tmp_path / "tok")(held_out)["input_ids"]
    assert ids == BertTokenizerFast.from_pretrained(tmp_path / "tok")(held_out)["input_ids"]
    assert ids[0] == [2, 1, 29, 32, 26, 24, 3]  # [CLS] [UNK] (no "h") newest widest low ##est [SEP]


# Sennrich et al.'s example: each tie between pairs is decided the same whatever the order of the "##c" entries (see
# test_same_vocabulary_as_tokenizers_and_the_saved_directory_loads_in_transformers), cased and uncased.
SENNRICH = ["low " * 5 + "lower " * 2, "newest " * 6 + "Widest " * 3 + "Café " * 4]


@pytest.mark.parametrize("lower", [True, False])
def test_train_new_from_iterator_learns_what_transformers_learns_with_the_source_settings(lower):
    # Was: AttributeError (transformers users' `tok.train_new_from_iterator(batches, vocab_size)`). The vocabulary is
    # transformers' on the same texts, normalised as the source tokenizer normalises (cased: "W", "C" and "é" kept).
    from transformers import BertTokenizerFast

    source = ["[PAD]", "x", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "y"]  # ids as in BERT: [PAD] first, the rest later
    ours = BertTokenizer(source, do_lower_case=lower).train_new_from_iterator([SENNRICH], vocab_size=100,
                                                                              show_progress=False)
    ref = BertTokenizerFast(vocab={t: i for i, t in enumerate(source)}, do_lower_case=lower)
    ref = ref.train_new_from_iterator([SENNRICH], vocab_size=100)
    vocab = [ours.convert_ids_to_tokens(i) for i in range(len(ours))]
    ref_vocab = sorted(ref.get_vocab(), key=ref.get_vocab().get)
    chars = [t for t in vocab if t.startswith("##") and len(t) == 3]  # tokenizers numbers these in hash-map order
    assert [t for t in vocab if t not in chars] == [t for t in ref_vocab if t not in chars]
    assert sorted(chars) == sorted(t for t in ref_vocab if t.startswith("##") and len(t) == 3)
    assert vocab[:5] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    assert ("widest" in vocab) == lower and ("Widest" in vocab) != lower and ("##fé" in vocab) != lower
    text = "The Widest Café, LOWEST newer"
    assert ours.tokenize(text) == ref.tokenize(text)
    assert ours.tokenize(text) == (["[UNK]", "widest", "cafe", "[UNK]", "low", "##est", "ne", "##w", "##er"] if lower
                                   else ["[UNK]", "Widest", "Café", "[UNK]", "[UNK]", "ne", "##w", "##er"])
    assert (ours.do_lower_case, ours.all_special_ids, len(ours)) == (lower, ref.all_special_ids, len(ref))


def test_train_new_from_iterator_renames_and_adds_special_tokens_as_transformers():
    from transformers import BertTokenizerFast

    source = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[E1]", "z"]
    ours = BertTokenizer(source, additional_special_tokens=["[E1]"])
    ref = BertTokenizerFast(vocab={t: i for i, t in enumerate(source)}, additional_special_tokens=["[E1]"])
    texts = iter(["low lower [E1] <ent> low", "newest widest"])  # each item one text, as tokenizers reads strings
    kwargs = {"new_special_tokens": ["<ent>", "[MASK]"], "min_frequency": 2, "length": 2}
    new = ours.train_new_from_iterator(texts, 60, special_tokens_map={"[UNK]": "<unk>", "[E1]": "<e1>"},
                                       show_progress=False, **kwargs)
    # transformers 5 renames an additional special token in the vocabulary but not in the tokenizer, which then adds
    # "[E1]" again past it: compared here on a renamed named token only.
    ref = ref.train_new_from_iterator(["low lower [E1] <ent> low", "newest widest"], 60,
                                      special_tokens_map={"[UNK]": "<unk>"}, **kwargs)
    assert [new.convert_ids_to_tokens(i) for i in range(7)] == ["[PAD]", "<unk>", "[CLS]", "[SEP]", "[MASK]", "<e1>",
                                                                "<ent>"]
    assert (new.unk_token, new.additional_special_tokens) == ("<unk>", ["<e1>", "<ent>"])
    assert sorted(zip(new.all_special_tokens, new.all_special_ids)) == \
        sorted((t.replace("[E1]", "<e1>"), i) for t, i in zip(ref.all_special_tokens, ref.all_special_ids))
    # The text's "[E1]" was read as text ("[", "e", "##1", "]"), as tokenizers reads it: the special tokens are not in
    # the tokenizer it trains. min_frequency 2: "low" (3 times) merges, "newest" (once) does not.
    assert new("q <ent> [MASK]")["input_ids"] == ref("q <ent> [MASK]")["input_ids"] == [2, 1, 6, 4, 3]
    assert new.tokenize("low newest") == ["low", "n", "##e", "##w", "##est"]  # "##est" twice: in both words
    assert "low" in ref.get_vocab() and "newest" not in ref.get_vocab()


def test_train_new_from_iterator_refuses_what_would_learn_from_the_wrong_text():
    tok = BertTokenizer(list(SPECIAL_TOKENS))
    used = (t for t in ["a b"])
    list(used)
    with pytest.raises(ValueError, match="no words found in the texts: is the iterator empty, or a generator already"):
        tok.train_new_from_iterator(used, 100, show_progress=False)
    # transformers reads a string as texts of one character each: a vocabulary of single letters
    with pytest.raises(ValueError, match=r"the texts are one string \('low lower'\.\.\.\): iterated, it would be read"):
        tok.train_new_from_iterator("low lower", 100, show_progress=False)
    with pytest.raises(TypeError, match=r"item 1 of the texts is a dict \(\{'text': 'b'\}\); .* yield row\['text'\]"):
        tok.train_new_from_iterator(["a", {"text": "b"}], 100, show_progress=False)
    with pytest.raises(TypeError, match=r"item 0 of the texts holds a NoneType \(None\)"):
        tok.train_new_from_iterator([["a", None]], 100, show_progress=False)
    # transformers ignores a key that is not a special token: the [UNK] a user meant to rename stays "[UNK]"
    with pytest.raises(ValueError, match=r"special_tokens_map renames \['\[unk\]'\], which are not special tokens"):
        tok.train_new_from_iterator(["a"], 100, special_tokens_map={"[unk]": "<unk>"}, show_progress=False)
    with pytest.raises(ValueError, match="min_frequency must be at least 0, got -1"):
        tok.train_new_from_iterator(["a"], 100, min_frequency=-1, show_progress=False)
    with pytest.raises(ValueError, match="vocab_size 6 leaves no room for characters beside the 6 special tokens"):
        tok.train_new_from_iterator(["a"], 6, new_special_tokens=["<e>"], show_progress=False)
    # transformers returns a vocabulary larger than asked for
    with pytest.raises(ValueError, match=r"vocab_size 8 is smaller than the 5 special tokens plus the 5-entry character "
                       r"alphabet; raise vocab_size or lower limit_alphabet \(now None: every character; --limit-alphabet"):
        tok.train_new_from_iterator(["abc"], 8, show_progress=False)
    with pytest.raises(TypeError, match="unexpected keyword argument 'continuing_subword_prefix'"):
        tok.train_new_from_iterator(["a"], 100, continuing_subword_prefix="@@")


def test_initial_alphabet_is_kept_whatever_its_count():
    counts = {"ab": 5, "abc": 3, "zq": 1, "q": 1}
    # "q" and "z" are the rarest, but kept before "b" and "c" with limit_alphabet 3; words with a cut character go
    vocab = learn_wordpiece(counts, vocab_size=100, min_frequency=1, limit_alphabet=3, initial_alphabet=["z", "q"])
    assert vocab == [*SPECIAL_TOKENS, "a", "q", "z", "##q", "zq"]
    assert learn_wordpiece(counts, 100, 1, limit_alphabet=None, initial_alphabet="é") == \
        [*SPECIAL_TOKENS, "a", "b", "c", "q", "z", "é", "##b", "##c", "##q", "ab", "abc", "zq"]
    with pytest.raises(ValueError, match=r"initial_alphabet holds 'ab': it takes single characters"):
        learn_wordpiece(counts, 100, 1, initial_alphabet=["ab"])


def test_a_script_without_a_main_guard_is_told_so_not_left_waiting(tmp_path):
    # Was: multiprocessing.Pool replaced each worker that died starting (a spawned worker runs the script again, which
    # calls the trainer again, which Python refuses in a worker) and waited for ever: a script written for tokenizers
    # (whose trainer needs no guard) hung with the default num_workers=2.
    import subprocess
    import sys

    files = [write(tmp_path, f"{i}.txt", f"some words of file {i}\n") for i in range(2)]
    script = write(tmp_path, "learn.py", "import sys\nfrom bertkit.tokenization.trainer import train_wordpiece_vocab\n"
                   "print(len(train_wordpiece_vocab(sys.argv[1:], vocab_size=100, progress=False)))\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    done = subprocess.run([sys.executable, str(script), *map(str, files)], capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 1
    # the error's line, once; the workers' own refusals (below) name the same fix, and leave nothing behind
    assert "leaked semaphore" not in done.stderr
    assert done.stderr.strip().splitlines().count(
        "bertkit.errors.BertkitError: a worker process ended before its work was done (num_workers=2). Workers start "
        "by running the calling script again: in a script, call this under `if __name__ == \"__main__\":` (or pass "
        "num_workers=1). Otherwise the machine may have killed it for memory: pass fewer workers") == 1


def test_a_worker_still_running_the_script_refuses_before_making_a_pool(monkeypatch):
    """A spawned worker re-running a script without a main guard made the executor (its queues' 5 semaphores) before
    Python refused to start its processes; the parent, seeing its pool broken, killed such a worker mid-way, and the
    resource tracker then warned "There appear to be 5 leaked semaphore objects" after bertkit's error (1 run in 3).
    The worker now refuses before it makes anything."""
    import multiprocessing

    from bertkit import _parallel
    from bertkit.errors import BertkitError

    made = []
    monkeypatch.setattr(_parallel, "ProcessPoolExecutor", lambda *a, **k: made.append(a))
    monkeypatch.setattr(multiprocessing.current_process(), "_inheriting", True, raising=False)
    with pytest.raises(BertkitError, match=r"^this worker process is running the calling script again, as each "
                                           r"spawned worker does, .*`if __name__ == \"__main__\":` \(or pass "
                                           r"num_workers=1\)$"):
        with _parallel.spawn_pool(2, 4):
            pass
    assert made == []
    with _parallel.spawn_pool(1, 4) as pool:  # one worker runs in this process: nothing to refuse
        assert pool is None


def test_train_tokenizer_command_takes_limit_alphabet(tmp_path, capsys):
    """Was: `bertkit train-tokenizer` had no --limit-alphabet: a corpus of more characters than a small vocabulary
    holds was refused with "lower limit_alphabet (now 1000)", which no flag set (argparse: unrecognized arguments).
    Now the command takes it, as BertWordPieceTokenizer.train does, and the refusal names the flag."""
    from bertkit.cli import main

    f = write(tmp_path, "t.txt", "ab AB ab\nab ab abc\n\nabc ABC zq q\n")
    out = tmp_path / "out"
    argv = ["train-tokenizer", str(f), "--out", str(out), "--vocab-size", "12", "--min-frequency", "1",
            "--no-progress", "--workers", "1"]
    # the 5 characters (a b c q z) and 3 "##" forms (##b ##c ##q) with the 5 special tokens: 13 entries
    assert main(argv) == 2
    assert "plus the 8-entry character alphabet; raise vocab_size or lower limit_alphabet (now 1000; " \
           "--limit-alphabet of bertkit train-tokenizer)" in capsys.readouterr().err
    assert not out.exists()
    # the 3 most frequent characters (a 8, b 8, c 3): "zq" and "q" are left out, "ab" and "abc" learnt
    assert main([*argv, "--limit-alphabet", "3"]) == 0
    assert (out / "vocab.txt").read_text(encoding="utf-8").splitlines() == [*SPECIAL_TOKENS, "a", "b", "c", "##b",
                                                                             "##c", "ab", "abc"]


def test_a_double_star_pattern_reads_files_at_every_depth(tmp_path):
    """Was: glob without recursion read `**` as `*`: "corpus/**/*.txt" learnt from the files one directory down only,
    leaving out those at the top and deeper, without a word (1 of 3 files here). Now `**` is any number of
    directories, as in zsh, bash's globstar and Python's glob(recursive=True); hidden directories are not read."""
    from bertkit.tokenization.textfiles import expand_input_files

    write(tmp_path, "top.txt", "alpha\n")
    (tmp_path / "x" / "y").mkdir(parents=True)
    (tmp_path / ".hidden").mkdir()
    write(tmp_path / "x", "one.txt", "beta\n")
    write(tmp_path / "x" / "y", "two.txt", "gamma\n")
    write(tmp_path / ".hidden", "staged.txt", "delta\n")
    pattern = str(tmp_path / "**" / "*.txt")
    assert expand_input_files(pattern) == [str(tmp_path / "top.txt"), str(tmp_path / "x" / "one.txt"),
                                           str(tmp_path / "x" / "y" / "two.txt")]
    vocab = train_wordpiece_vocab(pattern, 100, 1, num_workers=1, progress=False)
    assert {"alpha", "beta", "gamma"} <= set(vocab) and "delta" not in vocab


def test_a_rerun_whose_pattern_matches_its_own_output_is_refused_not_learnt_from(tmp_path, capsys):
    """Was: `train-tokenizer 'corpus/*/*.txt' --out corpus/vocab --overwrite` run a second time matched the first
    run's vocab.txt and learnt from it as text ('[', ']', '#', 'pad', 'unk' ...: 35 entries became 59, silently);
    the check that an output holds none of the command's inputs took the pattern for a path that does not exist.
    Now a pattern's matches are the inputs, and the rerun is refused, its output left as it was."""
    from bertkit.cli import main

    (tmp_path / "corpus" / "sub").mkdir(parents=True)
    write(tmp_path / "corpus" / "sub", "a.txt", "the cat sat on the mat\nthe dog ran\n")
    out = tmp_path / "corpus" / "vocab"
    argv = ["train-tokenizer", str(tmp_path / "corpus" / "*" / "*.txt"), "--out", str(out), "--vocab-size", "60",
            "--min-frequency", "1", "--no-progress", "--workers", "1"]
    assert main(argv) == 0
    first = (out / "vocab.txt").read_text(encoding="utf-8")
    assert len(first.splitlines()) == 35
    capsys.readouterr()
    assert main([*argv, "--overwrite"]) == 2
    assert capsys.readouterr().err.strip() == (
        f"bertkit train-tokenizer: error: --output-dir {out} holds the command's own input --files {out / 'vocab.txt'} "
        f"(matched by {argv[1]}); bertkit never writes into or clears a command's inputs: choose an output outside "
        "them")
    assert (out / "vocab.txt").read_text(encoding="utf-8") == first


def test_a_pattern_matching_an_output_bertkit_wrote_is_refused_not_read_as_text(tmp_path, capsys):
    """train-tokenizer 'corpus/*/*.txt' --out corpus/vocab, then the same pattern again (create-pretraining-data, or a
    second vocabulary elsewhere): the pattern matches the first run's vocab.txt, which was read as documents (its
    '[PAD]', '##s' ... lines) without a word. A file a manifest proves bertkit's is refused by name; the same text
    copied in by the user (no manifest) is the user's to read."""
    from bertkit.cli import main

    (tmp_path / "corpus" / "sub").mkdir(parents=True)
    write(tmp_path / "corpus" / "sub", "a.txt", "the cat sat on the mat\n\nthe dog ran\n")
    pattern = str(tmp_path / "corpus" / "*" / "*.txt")
    vocab = tmp_path / "corpus" / "vocab"
    base = ["--vocab-size", "60", "--min-frequency", "1", "--no-progress", "--workers", "1"]
    assert main(["train-tokenizer", pattern, "--out", str(vocab), *base]) == 0
    capsys.readouterr()
    for argv in (["train-tokenizer", pattern, "--out", str(tmp_path / "other"), *base],
                 ["create-pretraining-data", pattern, "--vocab", str(vocab), "--out", str(tmp_path / "data"),
                  "--no-progress"]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert f"{pattern} matches {vocab / 'vocab.txt'}, which bertkit wrote" in err and "narrow the pattern" in err
    assert not (tmp_path / "other").exists() and not (tmp_path / "data").exists()
    copied = tmp_path / "corpus" / "copy"
    copied.mkdir()
    (copied / "vocab.txt").write_text((vocab / "vocab.txt").read_text(encoding="utf-8"), encoding="utf-8")
    (vocab / ".bertkit-run.json").unlink()  # no longer proven bertkit's: the user's to read, as the copy is
    assert main(["train-tokenizer", pattern, "--out", str(tmp_path / "other"), *base]) == 0
