"""Pre-training data: corpus text -> masked-LM / next-sentence instances on disk -> training batches."""

from bertkit.data.pretraining import (
    PretrainingConfig,
    PretrainingDataset,
    collate_pretraining,
    create_pretraining_data,
)

__all__ = ["PretrainingConfig", "PretrainingDataset", "collate_pretraining", "create_pretraining_data"]
