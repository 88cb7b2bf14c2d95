"""Next-sentence pairs: documents -> (segment A, segment B, is-random-next), as google-research/bert makes them
(the deliberate differences from it: docs/pretraining-data.md)."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from bertkit.data.config import PretrainingConfig


@dataclass
class PairInstance:
    """Segments A and B before masking, with where they came from (sentence indices, end exclusive)."""

    tokens_a: list[int]
    tokens_b: list[int]
    is_random_next: bool
    a_span: tuple[int, int, int]  # (document, first sentence, end sentence)
    b_span: tuple[int, int, int]


def create_instances_from_document(
    documents: Sequence[Sequence[Sequence[int]]],
    document_index: int,
    config: PretrainingConfig,
    rng: random.Random,
) -> list[PairInstance]:
    """All A/B pairs from one document (a list of tokenised sentences)."""
    document = documents[document_index]
    max_num_tokens = config.max_seq_length - 3

    def draw_target() -> int:
        if rng.random() < config.short_seq_prob:
            return rng.randint(2, max_num_tokens)
        return max_num_tokens

    instances: list[PairInstance] = []
    target = draw_target()
    chunk_start, chunk_length, i = 0, 0, 0
    while i < len(document):
        chunk_length += len(document[i])
        if i == len(document) - 1 or chunk_length >= target:
            chunk_end = i + 1
            is_random_next = rng.random() < config.random_next_prob
            if not is_random_next and chunk_end - chunk_start == 1:
                if chunk_end == len(document):
                    break  # a lone last sentence cannot have a true next sentence
                chunk_end += 1  # a positive needs a second sentence: take the next one as B
                i += 1
            a_end = chunk_start + 1
            if chunk_end - chunk_start >= 2:
                a_end = rng.randint(chunk_start + 1, chunk_end - 1)
            tokens_a = [t for s in document[chunk_start:a_end] for t in s]
            a_span = (document_index, chunk_start, a_end)
            if is_random_next:
                b_span = _random_document_span(documents, document_index, target - len(tokens_a), rng)
                tokens_b = [t for s in documents[b_span[0]][b_span[1] : b_span[2]] for t in s]
                i = a_end - 1  # put the chunk's unused sentences back
            else:
                tokens_b = [t for s in document[a_end:chunk_end] for t in s]
                b_span = (document_index, a_end, chunk_end)
            truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            instances.append(PairInstance(tokens_a, tokens_b, is_random_next, a_span, b_span))
            chunk_start, chunk_length = i + 1, 0
            target = draw_target()
        i += 1
    return instances


def _random_document_span(
    documents: Sequence[Sequence[Sequence[int]]], document_index: int, target_b: int, rng: random.Random
) -> tuple[int, int, int]:
    other = document_index
    for _ in range(10):  # the reference's ten tries; a one-document pool falls back to itself
        other = rng.randint(0, len(documents) - 1)
        if other != document_index:
            break
    sentences = documents[other]
    start = rng.randint(0, len(sentences) - 1)
    return (other, start, _take_forward(sentences, start, len(sentences), target_b))


def _take_forward(sentences: Sequence[Sequence[int]], start: int, limit: int, target: int) -> int:
    end, length = start, 0
    while end < limit:
        length += len(sentences[end])
        end += 1
        if length >= target:
            break
    return end


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """Trim the longer segment, one token at a time from its front or back (50/50), to fit; in place."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        # Google: truncate from the front or the back at random "to add more randomness and avoid biases".
        if rng.random() < 0.5:
            del trunc[0]
        else:
            trunc.pop()
