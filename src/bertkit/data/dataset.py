"""Reading pre-training instances back for training: the memory-mapped dataset and its batch collate.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from bertkit.data.masking import MaskingTables, mask_tokens
from bertkit.data.shards import VOCAB, ShardedInstances
from bertkit.heads import IGNORE_INDEX  # positions without a masked-LM target (the loss skips them)
from bertkit.tokenization.wordpiece import load_vocab


class PretrainingDataset:
    """Instances from a :func:`create_pretraining_data` directory, ready for ``BertForPreTraining``.

    ``dataset[i]`` is a dict of unpadded numpy ``int64`` arrays: ``input_ids``, ``token_type_ids``,
    ``attention_mask`` (ones), ``labels`` (the original id at masked-LM positions, ``-100``
    elsewhere) and a scalar ``next_sentence_label`` (0 = B follows A, 1 = B is random, as Hugging
    Face). Batch them with :func:`collate_pretraining`. Works as a ``torch.utils.data.Dataset``
    (``__len__``/``__getitem__``), memory-mapped, so DataLoader workers share the page cache.

    Static masking: the stored masks; ``epoch`` and ``seed`` are ignored. Dynamic masking: masks are
    drawn from ``numpy.random.default_rng([seed, epoch, index])`` on every access, so they are the same
    for the same (seed, epoch) and differ across epochs; ``seed=None`` uses the seed in the manifest.
    Call :meth:`set_epoch` at the start of each epoch (the training loop does).

        ds = PretrainingDataset("runs/pretrain-data", epoch=0)
        batch = collate_pretraining([ds[i] for i in range(32)], pad_id=0)
    """

    def __init__(self, data_dir: str | os.PathLike, epoch: int = 0, seed: int | None = None, verify: bool = False):
        self.path = Path(data_dir)
        self.store = ShardedInstances(self.path, verify=verify)
        self.manifest = self.store.manifest
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
        self.tables = MaskingTables.from_vocab(load_vocab(self.path / VOCAB)) if self.dynamic else None

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.store)

    def __getitem__(self, index: int) -> dict[str, np.ndarray]:
        raw = self.store[index]
        ids = raw.input_ids.astype(np.int64)
        if self.dynamic:
            rng = np.random.default_rng([self.seed, self.epoch, index % len(self)])
            ids, positions, targets = mask_tokens(ids, raw.type_start, self.tables, rng=rng, **self._masking)
        else:
            positions, targets = raw.masked_positions, raw.masked_labels
        labels = np.full(len(ids), IGNORE_INDEX, dtype=np.int64)
        labels[positions] = targets
        token_type_ids = np.zeros(len(ids), dtype=np.int64)
        token_type_ids[raw.type_start :] = 1
        return {
            "input_ids": ids,
            "token_type_ids": token_type_ids,
            "attention_mask": np.ones(len(ids), dtype=np.int64),
            "labels": labels,
            "next_sentence_label": np.int64(raw.next_sentence_label),
        }


def collate_pretraining(batch: Sequence[dict], pad_id: int = 0) -> dict:
    """Pad a list of :class:`PretrainingDataset` items to the longest (``data.collate.collate``): ``torch.long``
    tensors, ``input_ids`` padded with ``pad_id``, ``labels`` with -100, ``next_sentence_label`` of shape ``(B,)``."""
    # Imported here, so that data-creation workers never pay for importing torch.
    from bertkit.data.collate import collate

    return collate(batch, pad_id)
