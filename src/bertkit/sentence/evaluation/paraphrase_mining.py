"""ParaphraseMiningEvaluator: mine the most similar pairs of a set of sentences (``util.paraphrase_mining``) and
score them against the known duplicate pairs, as sentence-transformers does: average precision over the mined
list, and the best F1 with its precision, recall and threshold (same keys, same numbers)."""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from bertkit.errors import BertkitError, WholeSetting
from bertkit.sentence.evaluation.base import EmbeddingEvaluator, ResultsCsv, prefixed, results_csv_name
from bertkit.sentence.util import paraphrase_mining_embeddings


def _closure(duplicates: set[tuple[Hashable, Hashable]]) -> set[tuple[Hashable, Hashable]]:
    """Every pair within each connected group of duplicates (a ~ b and b ~ c give a ~ c)."""
    neighbours: dict[Hashable, set[Hashable]] = {}
    for a, b in duplicates:
        neighbours.setdefault(a, set()).add(b)
        neighbours.setdefault(b, set()).add(a)
    closed, seen = set(), set()
    for start in neighbours:
        if start in seen:
            continue
        group, todo = {start}, [start]
        while todo:
            for other in neighbours[todo.pop()] - group:
                group.add(other)
                todo.append(other)
        seen |= group
        closed |= {(a, b) for a in group for b in group if a != b}
    return closed


class ParaphraseMiningEvaluator(ResultsCsv, EmbeddingEvaluator):
    """``average_precision``, ``f1``, ``precision``, ``recall`` and ``threshold`` of the pairs mined from
    ``sentences_map`` ({id: sentence}) against the duplicates (``duplicates_list`` of id pairs and/or
    ``duplicates_dict`` {id1: {id2: bool}}, which sentence-transformers documents as symmetric; a pair counts in
    either direction, and pairs naming an id outside ``sentences_map`` are left out). Mining takes ``top_k`` neighbours
    per sentence and keeps ``max_pairs``, scoring pairs with the model's ``similarity``. With an ``output_path``:
    ``paraphrase_mining_evaluation[_{name}]_results.csv``."""

    # checked when the evaluator is made, not when mining (after steps of training): a max_pairs of 2.5 or NaN mined
    # nothing, average precision 0 without a word
    top_k, max_pairs = WholeSetting(), WholeSetting()
    query_chunk_size, corpus_chunk_size = WholeSetting(), WholeSetting()

    def __init__(self, sentences_map: Mapping[Hashable, str],
                 duplicates_list: Iterable[tuple[Hashable, Hashable]] | None = None,
                 duplicates_dict: Mapping[Hashable, Mapping[Hashable, bool]] | None = None,
                 add_transitive_closure: bool = False, query_chunk_size: int = 5000, corpus_chunk_size: int = 100000,
                 max_pairs: int = 500000, top_k: int = 100, show_progress_bar: bool = False, batch_size: int = 16,
                 name: str = "", write_csv: bool = True, truncate_dim: int | None = None):
        if not sentences_map:
            raise BertkitError("ParaphraseMiningEvaluator: sentences_map is empty; give {id: sentence}")
        self.ids, self.sentences = list(sentences_map), list(sentences_map.values())
        pairs = {(a, b) for a, row in (duplicates_dict or {}).items() for b, duplicate in row.items() if duplicate}
        pairs |= {(a, b) for a, b in duplicates_list or () if a in sentences_map and b in sentences_map}
        pairs |= {(b, a) for a, b in pairs}
        if add_transitive_closure:  # through any id of duplicates_dict, as sentence-transformers closes it
            pairs = _closure(pairs)
        self.duplicates = {(a, b) for a, b in pairs if a in sentences_map and b in sentences_map}
        self.total_num_duplicates = len({frozenset(p) for p in self.duplicates})
        if not self.total_num_duplicates:  # sentence-transformers reports the undefined precision as 0
            named = [*(duplicates_list or ()), *((a, b) for a, row in (duplicates_dict or {}).items() for b, duplicate
                                                in row.items() if duplicate)]
            raise BertkitError(
                f"ParaphraseMiningEvaluator: no duplicate pair names two ids of sentences_map (ids such as "
                f"{list(sentences_map)[:3]!r}), so average precision is undefined"
                + (f"; the pairs given, such as {named[:3]!r}, name others (ids of another type?)" if named else
                   "; give duplicates_list or duplicates_dict"))
        self.query_chunk_size, self.corpus_chunk_size = query_chunk_size, corpus_chunk_size
        self.max_pairs, self.top_k, self.truncate_dim = max_pairs, top_k, truncate_dim
        self.show_progress_bar, self.batch_size, self.name, self.write_csv = show_progress_bar, batch_size, name, write_csv
        self.primary_metric = f"{name}_average_precision" if name else "average_precision"
        self.csv_file = results_csv_name("paraphrase_mining_evaluation", name)

    def __call__(self, model: Any, output_path: str | None = None, epoch: int = -1, steps: int = -1) -> dict[str, float]:
        embeddings = self.embed(model, self.sentences)  # util.paraphrase_mining's encode
        # scored with the model's own similarity (its similarity_fn_name), as sentence-transformers 6.3 mines them
        mined = paraphrase_mining_embeddings(embeddings, self.query_chunk_size, self.corpus_chunk_size, self.max_pairs,
                                             self.top_k, model.similarity)
        total = self.total_num_duplicates
        found = found_before = 0
        ap = best_f1 = best_precision = best_recall = threshold = 0  # ints until found, as the CSV shows them
        # Pairs of equal score are taken together: the list is read group by group, at each group's last pair
        for at, (score, i, j) in enumerate(mined):
            found += (self.ids[i], self.ids[j]) in self.duplicates
            if at + 1 < len(mined) and mined[at + 1][0] == score:
                continue
            if found > found_before:
                precision, recall = found / (at + 1), found / total
                f1 = 2 * precision * recall / (precision + recall)
                ap += precision * (found - found_before)
                if f1 > best_f1:
                    best_f1, best_precision, best_recall = f1, precision, recall
                    threshold = (score + mined[min(at + 1, len(mined) - 1)][0]) / 2
            found_before = found
        metrics = {"average_precision": ap / total, "f1": best_f1, "precision": best_precision,
                   "recall": best_recall, "threshold": threshold}
        self.write_results(output_path, ["epoch", "steps", "precision", "recall", "f1", "threshold", "average_precision"],
                           [epoch, steps, *(metrics[k] for k in ("precision", "recall", "f1", "threshold", "average_precision"))])
        return prefixed(metrics, self.name)
