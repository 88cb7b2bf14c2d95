"""Reading pre-training instances back for training: the memory-mapped dataset and its batch collate.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bertkit.data.masking import MaskingTables, mask_tokens
from bertkit.data.shards import BASE_FIELDS, MANIFEST, MASK_FIELDS, VOCAB, read_manifest
from bertkit.errors import BertkitError, MissingFileError
from bertkit.heads import IGNORE_INDEX  # positions without a masked-LM target (the loss skips them)
from bertkit.manifests import sha256_of
from bertkit.tokenization.wordpiece import load_vocab


class PretrainingDataset:
    """Instances from a :func:`create_pretraining_data` directory, ready for ``BertForPreTraining``.

    ``dataset[i]`` is a dict of unpadded numpy ``int64`` arrays (docs/pretraining-data.md, "On disk"); batch
    them with :func:`collate_pretraining`. The shards are memory-mapped, so DataLoader workers share the page
    cache.

    Opening checks every shard file against the sha256 the manifest recorded when it was written (a file replaced
    or changed since is refused, naming it); a copy unpickled in a DataLoader worker opens the files its creator
    checked without hashing them again.

    Static masking: the stored masks; ``epoch`` and ``seed`` are ignored. Dynamic masking: masks are
    drawn from ``numpy.random.default_rng([seed, epoch, index])`` on every access, so they are the same
    for the same (seed, epoch) and differ across epochs; ``seed=None`` uses the seed in the manifest.
    Call :meth:`set_epoch` at the start of each epoch (the training loop does).

        ds = PretrainingDataset("runs/pretrain-data", epoch=0)
        batch = collate_pretraining([ds[i] for i in range(32)], pad_id=0)
    """

    def __init__(self, data_dir: str | os.PathLike, epoch: int = 0, seed: int | None = None):
        self.path = Path(data_dir)
        self.manifest = read_manifest(self.path)
        cfg = self.manifest["config"]
        self.max_seq_length: int = cfg["max_seq_length"]
        self.dynamic = cfg["masking"] == "dynamic"
        self.seed = cfg["seed"] if seed is None else seed
        self.epoch = epoch
        self._masking = dict(
            masked_lm_prob=cfg["masked_lm_prob"],
            max_predictions=cfg["max_predictions_per_seq"],
            whole_word=cfg["whole_word_mask"],
        )
        special_ids = self.manifest["tokenizer"]["special_token_ids"]
        self.tables = MaskingTables.from_vocab(load_vocab(self.path / VOCAB), special_ids) if self.dynamic else None
        self._shards = self._open(verify=True)
        sizes = [len(s["next_sentence_labels"]) for s in self._shards]
        self._starts = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)])

    def _open(self, verify: bool) -> list[dict[str, np.ndarray]]:
        """Every shard's arrays, memory-mapped; with ``verify``, each file's sha256 checked against the manifest's
        first (0.15 s for the 51 MB of shards of the whole shared corpus: docs/pretraining-data.md)."""
        shards = []
        for shard in self.manifest["shards"]:
            arrays = {}
            for field in BASE_FIELDS + (() if self.dynamic else MASK_FIELDS):
                entry = shard["files"][field]
                path = self.path / entry["file"]
                if not path.is_file():
                    raise MissingFileError(f"{path} is listed in the manifest but missing")
                if verify and sha256_of(path) != entry["sha256"]:
                    raise BertkitError(f"{path} is not the file {MANIFEST} recorded when the data was written (its "
                                       "sha256 differs): it was replaced or changed since, so its instances are not "
                                       "the manifest's; put the original file back, or write the data again into a "
                                       "new directory (bertkit create-pretraining-data ... --output-dir NEW_DIR) and "
                                       "train on that")
                arrays[field] = np.load(path, mmap_mode="r", allow_pickle=False)
            shards.append(arrays)
        return shards

    def __getstate__(self) -> dict:
        # Pickling a memmap would copy its data; a spawned DataLoader worker re-opens the files instead.
        return {k: v for k, v in self.__dict__.items() if k != "_shards"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._shards = self._open(verify=False)  # checked by the process that made this dataset

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return int(self._starts[-1])

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"instance {index} out of range for {len(self)} instances")
        index %= len(self)
        shard_index = int(np.searchsorted(self._starts, index, side="right")) - 1
        shard = self._shards[shard_index]
        i = index - int(self._starts[shard_index])
        ids = np.asarray(shard["input_ids"][int(shard["offsets"][i]) : int(shard["offsets"][i + 1])], dtype=np.int64)
        type_start = int(shard["type_start"][i])
        if self.dynamic:
            rng = np.random.default_rng([self.seed, self.epoch, index])
            ids, positions, targets = mask_tokens(ids, type_start, self.tables, rng=rng, **self._masking)
        else:
            lo, hi = int(shard["masked_offsets"][i]), int(shard["masked_offsets"][i + 1])
            positions, targets = shard["masked_positions"][lo:hi], shard["masked_labels"][lo:hi]
        labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
        labels[positions] = targets
        token_type_ids = np.zeros(len(ids), dtype=np.int64)
        token_type_ids[type_start:] = 1
        return {
            "input_ids": ids,
            "token_type_ids": token_type_ids,
            "attention_mask": np.ones(len(ids), dtype=np.int64),
            "labels": labels,
            "next_sentence_label": np.int64(shard["next_sentence_labels"][i]),
        }


def collate_pretraining(batch: Sequence[dict], pad_id: int = 0) -> dict:
    """Pad a list of :class:`PretrainingDataset` items to the longest (``data.collate.collate``): ``torch.long``
    tensors, ``input_ids`` padded with ``pad_id``, ``labels`` with -100, ``next_sentence_label`` of shape ``(B,)``."""
    # Imported here, so that data-creation workers never pay for importing torch.
    from bertkit.data.collate import collate

    return collate(batch, pad_id)
