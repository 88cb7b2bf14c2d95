"""Learn a WordPiece vocabulary from raw text files.

The algorithm of Hugging Face ``tokenizers``' ``WordPieceTrainer``: byte-pair merges over characters where
every piece after a word's first carries ``##``, most frequent pair first (Sennrich et al., 2016; the BERT
paper only says "WordPiece embeddings (Wu et al., 2016) with a 30,000 token vocabulary"). Steps: (1-2) word
counts, in ``num_workers`` processes; (3) the alphabet; (4) merges with incrementally updated pair counts and a
lazy max-heap. docs/pretraining-data.md, section 1, has the details. ``train_new_tokenizer`` is transformers'
``train_new_from_iterator`` on this trainer: a vocabulary learned from texts in memory, the settings of a tokenizer.
"""

from __future__ import annotations

import heapq
import os
import sys
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from bertkit._parallel import spawn_pool
from bertkit.errors import BertkitError
from bertkit.progress import progress_bar
from bertkit.tokenization.basic import NON_SEPARATOR_SPACE_RE, BasicTokenizer
from bertkit.tokenization.loading import SPECIAL_TOKEN_KEYS
from bertkit.tokenization.textfiles import expand_input_files, iter_lines
from bertkit.tokenization.wordpiece import PREFIX, SPECIAL_TOKENS


def train_wordpiece_vocab(
    files: str | os.PathLike | Sequence[str | os.PathLike],
    vocab_size: int = 30522,
    min_frequency: int = 2,
    lowercase: bool = True,
    *,
    strip_accents: bool | None = None,
    tokenize_chinese_chars: bool = True,
    limit_alphabet: int = 1000,
    errors: str = "strict",
    num_workers: int = 2,
    progress: bool = True,
) -> list[str]:
    """Learn a WordPiece vocabulary of at most ``vocab_size`` entries from raw text ``files``.

    ``lowercase`` / ``strip_accents`` / ``tokenize_chinese_chars`` mean what they mean for
    :class:`~bertkit.tokenization.BertTokenizer` (``strip_accents=None`` strips accents when
    lower-casing); save the result with the same settings:
    ``BertTokenizer(vocab, do_lower_case=lowercase, ...).save_pretrained(directory)``. ``errors`` is how bytes
    that are not UTF-8 are handled (``"strict"`` raises, naming file and line; or ``"replace"``).
    Returns the vocabulary, index = token id.
    """
    _check_settings(vocab_size, min_frequency, limit_alphabet)  # before counting, which can take minutes
    if not files:
        raise BertkitError("no input files: pass at least one text file to learn a vocabulary from")
    files = expand_input_files(files, "its words would be counted twice, which changes the vocabulary (pieces "
                               "that reach --min-frequency only by the copy); pass each file once")
    basic = BasicTokenizer(lowercase, strip_accents, tokenize_chinese_chars)
    counts = count_words(files, basic, errors=errors, num_workers=num_workers, progress=progress)
    if not counts:
        raise BertkitError(f"no words found in the {len(files)} input file(s): are they empty?")
    return learn_wordpiece(
        counts,
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        limit_alphabet=limit_alphabet,
        progress=progress,
    )


# --------------------------------------------------------------------------------------------------
# 1-2. Word counts
# --------------------------------------------------------------------------------------------------


def count_words(
    files: Sequence[str | os.PathLike],
    basic: BasicTokenizer | None = None,
    *,
    errors: str = "strict",
    num_workers: int = 2,
    progress: bool = False,
) -> Counter[str]:
    """Count ``basic``'s words (default: BERT's uncased one) over ``files`` (module docstring, steps 1-2)."""
    basic = basic or BasicTokenizer()
    chunks: Counter[str] = Counter()
    with spawn_pool(num_workers, len(files)) as pool:
        jobs = [(str(f), errors) for f in files]
        results = pool.imap(_count_chunks, jobs) if pool else map(_count_chunks, jobs)
        for counter in progress_bar(results, total=len(jobs), desc="count", unit="file", enabled=progress):
            chunks.update(counter)
        distinct = list(chunks.items())
        del chunks
        n_slices = max(1, 4 * max(num_workers, 1))
        slices = [(distinct[i::n_slices], basic) for i in range(n_slices)]
        del distinct
        results = pool.imap(_tokenize_chunks, slices) if pool else map(_tokenize_chunks, slices)
        words: Counter[str] = Counter()
        for counter in progress_bar(results, total=n_slices, desc="pre-tokenize", enabled=progress):
            words.update(counter)
    return words


def _count_chunks(job: tuple[str, str]) -> Counter[str]:
    path, errors = job
    counter: Counter[str] = Counter()
    block: list[str] = []
    size = 0
    # Lines in blocks of about 64k characters: fewer calls (faster than a line at a time without the regex), memory
    # bounded. `str.split()` also splits at characters BERT deletes ("foo\x0cbar" is one word): delete them first.
    for line in iter_lines(path, errors=errors):
        block.append(line)
        size += len(line)
        if size > 65536:
            counter.update(NON_SEPARATOR_SPACE_RE.sub("", " ".join(block)).split())
            block, size = [], 0
    counter.update(NON_SEPARATOR_SPACE_RE.sub("", " ".join(block)).split())
    return counter


def _tokenize_chunks(job: tuple[list[tuple[str, int]], BasicTokenizer]) -> Counter[str]:
    chunks, basic = job
    words: Counter[str] = Counter()
    for chunk, n in chunks:
        for word in basic.tokenize(chunk):
            words[word] += n
    return words


# --------------------------------------------------------------------------------------------------
# 3-4. Alphabet and merges
# --------------------------------------------------------------------------------------------------


def learn_wordpiece(
    word_counts: Mapping[str, int],
    vocab_size: int,
    min_frequency: int = 2,
    *,
    limit_alphabet: int | None = 1000,
    initial_alphabet: Iterable[str] = (),
    special_tokens: Sequence[str] = SPECIAL_TOKENS,
    progress: bool = False,
) -> list[str]:
    """Learn the vocabulary from a table of word counts (module docstring, steps 3-4). The vocabulary starts with
    ``special_tokens``; ``limit_alphabet=None`` keeps every character; the characters of ``initial_alphabet`` are
    kept whatever their count (as in tokenizers' ``WordPieceTrainer``)."""
    _check_settings(vocab_size, min_frequency, limit_alphabet, len(special_tokens))

    vocab, words = _alphabet(word_counts, vocab_size, limit_alphabet, initial_alphabet, special_tokens)
    # Symbols are the vocabulary entries; words are lists of symbol ids.
    symbol_id = {s: i for i, s in enumerate(vocab)}
    prefix = PREFIX
    seqs = [[symbol_id[w[0]]] + [symbol_id[prefix + ch] for ch in w[1:]] for w in words]
    counts = [word_counts[w] for w in words]
    del words

    pair_counts, where = _count_pairs(seqs, counts)
    heap = [(-n, a, b) for (a, b), n in pair_counts.items()]
    heapq.heapify(heap)

    bar = progress_bar(total=vocab_size, initial=len(vocab), desc="merges", enabled=progress)
    while len(vocab) < vocab_size and heap:
        neg, a, b = heapq.heappop(heap)
        current = pair_counts.get((a, b), 0)
        if current != -neg:
            if current > 0:
                heapq.heappush(heap, (-current, a, b))
            continue
        if current < min_frequency:
            break
        piece = vocab[a] + vocab[b][len(prefix) :]
        new = symbol_id.get(piece)
        if new is None:  # two different pairs can spell the same piece; keep one id, as tokenizers does
            new = len(vocab)
            vocab.append(piece)
            symbol_id[piece] = new
            bar.update(1)
        touched = _merge_pair(seqs, counts, pair_counts, where, a, b, new)
        for pair in touched:
            n = pair_counts.get(pair, 0)
            if n > 0:
                heapq.heappush(heap, (-n, pair[0], pair[1]))
    bar.close()
    return vocab


def _check_settings(vocab_size: int, min_frequency: int, limit_alphabet: int | None,
                    n_special: int = len(SPECIAL_TOKENS)) -> None:
    if vocab_size <= n_special:
        raise BertkitError(
            f"vocab_size {vocab_size} leaves no room for characters beside the {n_special} special tokens; "
            "raise vocab_size (BERT's is 30522)"
        )
    if min_frequency < 1:
        raise BertkitError(f"min_frequency must be at least 1, got {min_frequency}")
    if limit_alphabet is not None and limit_alphabet < 1:
        raise BertkitError(f"limit_alphabet must be at least 1, got {limit_alphabet}")


def _alphabet(
    word_counts: Mapping[str, int], vocab_size: int, limit_alphabet: int | None, initial_alphabet: Iterable[str],
    special_tokens: Sequence[str],
) -> tuple[list[str], list[str]]:
    """Step 3: (the starting vocabulary, the words spelled in its alphabet, sorted). The vocabulary is the special
    tokens, the ``limit_alphabet`` most frequent characters (those of ``initial_alphabet`` first) and ``##`` + each
    character seen inside a word."""
    char_counts: Counter[str] = Counter()
    for word, n in word_counts.items():
        for ch in word:
            char_counts[ch] += n
    for ch in initial_alphabet:
        if not isinstance(ch, str) or len(ch) != 1:
            raise BertkitError(f"initial_alphabet holds {ch!r}: it takes single characters (list('abc'))")
        char_counts[ch] = sys.maxsize  # as tokenizers counts them: kept unless limit_alphabet is below their number
    ranked = sorted(char_counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit_alphabet]
    alphabet = sorted(ch for ch, _ in ranked)
    alphabet_set = set(alphabet)

    words = sorted(w for w in word_counts if set(w) <= alphabet_set)
    inner_chars = sorted({ch for w in words for ch in w[1:]})
    vocab = list(dict.fromkeys(special_tokens))
    n_special = len(vocab)
    vocab += [ch for ch in alphabet if ch not in vocab]
    vocab += [PREFIX + ch for ch in inner_chars if PREFIX + ch not in vocab]
    if len(vocab) > vocab_size:
        raise BertkitError(
            f"vocab_size {vocab_size} is smaller than the {n_special} special tokens plus the "
            f"{len(vocab) - n_special}-entry character alphabet; raise vocab_size or lower "
            f"limit_alphabet (now {'None: every character' if limit_alphabet is None else limit_alphabet}; "
            "--limit-alphabet of bertkit train-tokenizer)"
        )
    return vocab, words


def _count_pairs(
    seqs: list[list[int]], counts: list[int]
) -> tuple[dict[tuple[int, int], int], dict[tuple[int, int], set[int]]]:
    """(each adjacent symbol pair's count over the corpus, the words holding it): what step 4 updates per merge."""
    pair_counts: dict[tuple[int, int], int] = defaultdict(int)
    where: dict[tuple[int, int], set[int]] = defaultdict(set)
    for w, seq in enumerate(seqs):
        n = counts[w]
        for pair in zip(seq, seq[1:], strict=False):
            pair_counts[pair] += n
            where[pair].add(w)
    return pair_counts, where


def _merge_pair(
    seqs: list[list[int]],
    counts: list[int],
    pair_counts: dict[tuple[int, int], int],
    where: dict[tuple[int, int], set[int]],
    a: int,
    b: int,
    new: int,
) -> set[tuple[int, int]]:
    """Replace ``a b`` by ``new`` in every word holding it; update pair counts; return the new pairs."""
    touched: set[tuple[int, int]] = set()
    for w in where.pop((a, b)):
        seq = seqs[w]
        if len(seq) < 2:
            continue
        merged: list[int] = []
        i, end = 0, len(seq)
        while i < end:
            if i + 1 < end and seq[i] == a and seq[i + 1] == b:
                merged.append(new)
                i += 2
            else:
                merged.append(seq[i])
                i += 1
        if len(merged) == end:  # a stale entry in `where`: the word no longer holds the pair
            continue
        n = counts[w]
        for pair in zip(seq, seq[1:], strict=False):
            pair_counts[pair] -= n
        for pair in zip(merged, merged[1:], strict=False):
            pair_counts[pair] += n
            if pair[0] == new or pair[1] == new:
                touched.add(pair)
                where[pair].add(w)
        seqs[w] = merged
    pair_counts.pop((a, b), None)
    return touched



# --------------------------------------------------------------------------------------------------
# Texts in memory: transformers' train_new_from_iterator
# --------------------------------------------------------------------------------------------------


def count_words_in_texts(
    texts: Iterable[str | Sequence[str]], basic: BasicTokenizer, *, total: int | None = None, progress: bool = False
) -> Counter[str]:
    """Count ``basic``'s words over ``texts``: texts, or batches (lists) of texts, as tokenizers'
    ``train_from_iterator`` takes them; each text is read as ``count_words`` reads a line."""
    if isinstance(texts, str):
        raise BertkitError(f"the texts are one string ({texts[:40]!r}...): iterated, it would be read one character at "
                           "a time, each a text; pass a list of texts, or an iterator of batches (lists) of texts")
    chunks: Counter[str] = Counter()
    for i, item in enumerate(progress_bar(texts, total=total, desc="count", enabled=progress)):
        for text in [item] if isinstance(item, str) else _batch(item, i):
            if not isinstance(text, str):
                raise TypeError(f"item {i} of the texts holds a {type(text).__name__} ({text!r:.40}); the iterator "
                                "must yield texts (str) or batches (lists) of texts")
            chunks.update(NON_SEPARATOR_SPACE_RE.sub("", text).split())
    return _tokenize_chunks((list(chunks.items()), basic))


def _batch(item: object, i: int) -> Iterable[object]:
    if isinstance(item, (bytes, Mapping)) or not isinstance(item, Iterable):
        raise TypeError(f"item {i} of the texts is a {type(item).__name__} ({item!r:.40}); the iterator must yield "
                        "texts (str) or batches (lists) of texts (a datasets row is a dict: yield row['text'])")
    return item


def train_new_tokenizer(
    tokenizer: Any,
    text_iterator: Iterable[str | Sequence[str]],
    vocab_size: int,
    length: int | None = None,
    new_special_tokens: Sequence[str] | None = None,
    special_tokens_map: Mapping[str, str] | None = None,
    *,
    min_frequency: int = 0,
    limit_alphabet: int | None = None,
    initial_alphabet: Iterable[str] = (),
    show_progress: bool = True,
) -> Any:
    """``tokenizer.train_new_from_iterator(...)``, as transformers': a tokenizer (``BertTokenizer``, which this module
    does not import: the tokenizer imports it) with ``tokenizer``'s normalisation
    (lower-casing, accents, Chinese characters) and special tokens and a vocabulary of at most ``vocab_size``
    learned from ``text_iterator``. The vocabulary starts with the special tokens in the order of their ids (renamed
    by ``special_tokens_map``, {old token: new token}), then ``new_special_tokens``; tokens added with ``add_tokens``
    are not carried over. The keywords are tokenizers' ``WordPieceTrainer``'s, with its defaults (``min_frequency``
    0, which merges what 1 merges; no ``limit_alphabet``); ``length`` (the number of items) is for the progress bar.
    """
    if min_frequency < 0:
        raise BertkitError(f"min_frequency must be at least 0, got {min_frequency}")
    rename = dict(special_tokens_map or {})
    unknown = sorted(set(rename) - set(tokenizer.all_special_tokens))
    if unknown:  # transformers ignores them: a misspelt key would leave the token as it was, silently
        raise BertkitError(f"special_tokens_map renames {unknown}, which are not special tokens of this tokenizer "
                           f"{tokenizer.all_special_tokens}: its keys are the tokens to rename, its values their new "
                           "text ({'[UNK]': '<unk>'})")
    new = list(new_special_tokens or [])
    for token in [*rename.values(), *new]:
        if not isinstance(token, str) or not token.strip():
            raise BertkitError(f"special token {token!r} is not a non-blank str; pass special tokens as strings")
    old = sorted(tokenizer.all_special_tokens, key=tokenizer.vocab.__getitem__)
    special_tokens = list(dict.fromkeys([*(rename.get(t, t) for t in old), *new]))
    _check_settings(vocab_size, max(min_frequency, 1), limit_alphabet, len(special_tokens))

    basic = BasicTokenizer(tokenizer.do_lower_case, tokenizer.strip_accents, tokenizer.tokenize_chinese_chars)
    counts = count_words_in_texts(text_iterator, basic, total=length, progress=show_progress)
    if not counts:
        raise BertkitError("no words found in the texts: is the iterator empty, or a generator already used up? "
                           "(a generator is read once: make a new one for each call)")
    vocab = learn_wordpiece(counts, vocab_size, max(min_frequency, 1), limit_alphabet=limit_alphabet,
                            initial_alphabet=initial_alphabet, special_tokens=special_tokens, progress=show_progress)
    named = {key: rename.get(getattr(tokenizer, key), getattr(tokenizer, key)) for key in SPECIAL_TOKEN_KEYS}
    additional = [rename.get(t, t) for t in tokenizer.additional_special_tokens] + new
    return type(tokenizer)(vocab, do_lower_case=tokenizer.do_lower_case, strip_accents=tokenizer.strip_accents,
                         tokenize_chinese_chars=tokenizer.tokenize_chinese_chars, **named,
                         additional_special_tokens=[t for t in dict.fromkeys(additional) if t not in named.values()],
                         model_max_length=tokenizer.model_max_length,
                         max_input_chars_per_word=tokenizer.max_input_chars_per_word,
                         clean_up_tokenization_spaces=tokenizer.clean_up_tokenization_spaces,
                         model_input_names=tokenizer.model_input_names)
