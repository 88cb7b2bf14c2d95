"""transformers' ``include_num_input_tokens_seen``: the input tokens the Trainer's training batches held, counted as
transformers' ``Trainer._track_num_input_tokens`` counts them (each micro-batch as the collator made it, every
rank's), and the ``train_tokens_per_second`` its logs carry (``speed_metrics``).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch

from bertkit.training.batch_plan import Batch
from bertkit.training.distributed import sum_over_ranks

logger = logging.getLogger("bertkit")


def input_tokens(batch: Batch, how: str, main_input_name: str, pad_token_id: int | None, device: Any) -> int | None:
    """``batch``'s input tokens, summed over the ranks: "all" counts the padded ``main_input_name`` tensor's entries,
    "non_padding" the attention mask's ones (else the entries that are not ``pad_token_id``). None where the batch has
    no ``main_input_name`` (a sentence trainer's features are named per column): transformers then counts nothing,
    with the warning it gives."""
    ids = batch.get(main_input_name)
    if not isinstance(ids, torch.Tensor):
        logger.warning("include_num_input_tokens_seen: the training batches have no %r (the model's main_input_name), "
                       "so no input token is counted, as transformers' Trainer counts none there", main_input_name)
        return None
    if how == "non_padding" and isinstance(batch.get("attention_mask"), torch.Tensor):
        count = int(batch["attention_mask"].sum())
    elif how == "non_padding" and pad_token_id is not None:
        count = int((ids != pad_token_id).sum())
    else:
        if how == "non_padding":
            logger.warning("include_num_input_tokens_seen 'non_padding': the batches have no attention_mask and the "
                           "processing_class no pad_token_id, so every token is counted, as transformers does")
        count = ids.numel()
    return sum_over_ranks(count, device)


def speed_metrics(split: str, start_time: float, num_tokens: int) -> dict[str, float]:
    """transformers' ``speed_metrics(split, start_time, num_tokens=...)``: the seconds since ``start_time`` (a
    ``time.time()``) and the tokens per second, rounded as transformers rounds them."""
    runtime = time.time() - start_time
    result = {f"{split}_runtime": round(runtime, 4)}
    if runtime != 0:
        result[f"{split}_tokens_per_second"] = round(num_tokens / runtime, 3)
    return result
