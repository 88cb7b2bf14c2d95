"""Pre-training BERT from scratch: masked LM + next-sentence prediction on ``bertkit create-pretraining-data``'s
instances, with the paper's recipe (section 3.1, appendix A.2), optionally in two phases: 90% of the steps on
128-token instances, the rest on 512-token ones ("to learn the positional embeddings").
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertkit.config import PRESETS, BertConfig
from bertkit.data.dataset import PretrainingDataset, collate_pretraining
from bertkit.data.shards import MANIFEST, VOCAB
from bertkit.errors import BertkitError
from bertkit.heads import IGNORE_INDEX, BertForMaskedLM, BertForPreTraining
from bertkit.inference.runner import evaluate, in_order
from bertkit.manifests import sha256_of
from bertkit.outputs import atomic_write_json
from bertkit.settings import PretrainSettings
from bertkit.settings.training import micro_batch_size
from bertkit.tokenization import BertTokenizer
from bertkit.tokenization.wordpiece import load_vocab
from bertkit.training.batch_plan import BatchPlan
from bertkit.training.distributed import current, process_device
from bertkit.training.loop import LoopHooks, Phase, TrainResult, train
from bertkit.training.plot import plot_metrics
from bertkit.weight_files import weight_files

logger = logging.getLogger("bertkit")


def _counts(batch: dict, out: Any) -> dict[str, float]:
    """One batch's sums: MLM targets, their loss and correct predictions; NSP instances, their loss and correct ones."""
    target = batch["labels"][batch["labels"] != IGNORE_INDEX]
    # a batch with no masked token adds nothing to the sum (its mean loss is NaN: nothing was predicted)
    counts = {"mlm": target.numel(), "mlm_loss": out.mlm_loss.item() * target.numel() if target.numel() else 0.0,
              "mlm_acc": int((out.prediction_logits.argmax(-1) == target).sum())}
    if out.nsp_loss is not None:  # BertForPreTraining, not BertForMaskedLM (--no-nsp)
        nsp = batch["next_sentence_label"]
        counts.update(nsp=len(nsp), nsp_loss=out.nsp_loss.item() * len(nsp),
                      nsp_acc=int((out.seq_relationship_logits.argmax(-1) == nsp).sum()))
    return counts


def _means(counts: dict[str, float]) -> dict[str, float]:
    """mlm_loss, mlm_acc (per predicted token) and nsp_loss, nsp_acc (per instance) from ``_counts``' sums."""
    return {k: v / max(1, counts[k.split("_")[0]]) for k, v in counts.items() if "_" in k}


def mlm_nsp_batch_metrics(batch: dict, out: Any) -> dict[str, tuple[float, int]]:
    """MLM loss and accuracy over the predicted positions and NSP loss and accuracy, for one batch: (sum, count)
    each, so that a logging window's are over its targets and instances, as the step's loss and the evaluation's."""
    counts = _counts(batch, out)
    return {k: (v, counts[k.split("_")[0]]) for k, v in counts.items() if "_" in k}


def collate_instances(items: list, pad_id: int, nsp: bool = True) -> dict:
    """``collate_pretraining``, without the next-sentence labels for MLM-only training (no NSP head takes them)."""
    batch = collate_pretraining(items, pad_id)
    if not nsp:
        del batch["next_sentence_label"]
    return batch


def evaluate_pretraining(model: BertForPreTraining, dataset, *, batch_size: int, pad_id: int, limit: int,
                         device: str = "cpu") -> dict[str, float]:
    """Held-out MLM and NSP loss and accuracy on the first ``limit`` instances, under the caller's autocast. Under
    torchrun every rank evaluates all of them, so every rank has the metrics without a collective."""
    n = min(limit, len(dataset))
    has_nsp = hasattr(getattr(model, "cls", None), "seq_relationship")  # BertForPreTraining, not BertForMaskedLM
    pad = functools.partial(collate_instances, pad_id=pad_id, nsp=has_nsp)
    per_batch = evaluate(lambda batch, _: _counts(batch, model(**batch)), dataset, in_order(range(n), batch_size),
                         device=device, bf16=None, model=model, pad=pad)
    totals = {k: sum(c[k] for _, c in per_batch) for k in per_batch[0][1]}
    return {**_means(totals), "instances": n}


def unigram_log_prior(dataset: PretrainingDataset, vocab_size: int, every: int = 50) -> torch.Tensor:
    """log p(target) of the masked-LM targets of every ``every``-th instance, add-one smoothed: the output bias
    at which a model with no use of context predicts the corpus' token frequencies."""
    counts = np.ones(vocab_size, dtype=np.float64)
    for i in range(0, len(dataset), every):
        labels = dataset[i]["labels"]
        counts += np.bincount(labels[labels != IGNORE_INDEX], minlength=vocab_size)[:vocab_size]
    return torch.from_numpy(np.log(counts / counts.sum())).float()


def sinusoidal_positions(positions: int, hidden: int, std: float) -> torch.Tensor:
    """The sine/cosine position table of Vaswani et al. (2017, section 3.5), scaled to entries of standard
    deviation ``std`` (the word embeddings' initializer_range), so that neither drowns the other in the sum."""
    pos = torch.arange(positions, dtype=torch.float64)[:, None]
    freq = torch.exp(-math.log(10000.0) * torch.arange(0, hidden, 2, dtype=torch.float64) / hidden)
    table = torch.zeros(positions, hidden, dtype=torch.float64)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)[:, : hidden // 2]
    return (table * (std / table.std())).float()


def model_config(spec: Any, vocab_size: int) -> BertConfig:
    """A preset name, a config.json path (or a model directory holding one, as transformers' ``--config_name``
    takes) or a BertConfig, with the tokenizer's vocabulary size."""
    if isinstance(spec, BertConfig):
        return spec
    if str(spec) in PRESETS:
        return BertConfig.preset(str(spec), vocab_size=vocab_size)
    path = Path(spec)
    return BertConfig.from_json_file(path / "config.json" if path.is_dir() else path, vocab_size=vocab_size)


def pretraining_config(s: PretrainSettings, tokenizer: BertTokenizer) -> BertConfig:
    """The model's config (``init_from``'s, or ``config_name``'s with the tokenizer's vocabulary size), checked
    against the tokenizer's vocabulary."""
    if s.init_from is not None:
        config = BertConfig.from_json_file(s.init_from / "config.json")
    else:
        config = model_config(s.config_name, len(tokenizer.vocab))
    if len(tokenizer.vocab) != config.vocab_size:
        raise BertkitError(
            f"the vocabulary in {s.vocab} has {len(tokenizer.vocab)} entries but the model config has "
            f"vocab_size {config.vocab_size}; " + (
                f"pre-train from {s.init_from} with the tokenizer it was trained with (its vocab.txt)"
                if s.init_from is not None else f"set vocab_size={len(tokenizer.vocab)}")
        )
    refuse_data_of_another_vocabulary(s, tokenizer)
    return config


def refuse_data_of_another_vocabulary(s: PretrainSettings, tokenizer: BertTokenizer) -> None:
    """Instances are token ids: read with another vocabulary than the one they were made with (the vocab.txt
    create-pretraining-data keeps beside them), each id names another word piece, and the model is trained on noise
    without a word (a 500-entry vocabulary's ids are all valid in a 30,522-entry one)."""
    ours = tokenizer.convert_ids_to_tokens(range(len(tokenizer)))
    for flag, data_dir in (("--data", s.data), ("--phase2-data", s.phase2_data), ("--eval-data", s.eval_data)):
        if data_dir is None or not (Path(data_dir) / VOCAB).is_file():
            continue  # no data there: PretrainingDataset names what is missing
        theirs = load_vocab(Path(data_dir) / VOCAB)
        if theirs != ours:
            i = next((i for i, (a, b) in enumerate(zip(theirs, ours)) if a != b), min(len(theirs), len(ours)))
            there, here = (repr(tokens[i]) if i < len(tokens) else "no token" for tokens in (theirs, ours))
            raise BertkitError(
                f"{flag} {data_dir} was made with another vocabulary than --vocab {s.vocab} ({len(theirs)} entries "
                f"against {len(ours)}; id {i} is {there} there, {here} here), so its token ids would name "
                f"other word pieces; pass --vocab the tokenizer directory it was made with (the one whose vocab.txt "
                f"create-pretraining-data copied to {Path(data_dir) / VOCAB}: the data directory holds no tokenizer), "
                "or recreate the data with this one")


def pretraining_phases(s: PretrainSettings, config: BertConfig, collate: Any, *, rank: int,
                       world_size: int) -> list[Phase]:
    """One phase per data directory (``data``, then ``phase2_data``), with ``max_steps`` split between them by
    ``phase1_fraction``."""
    micro = micro_batch_size(s.batch_size, world_size, s.gradient_accumulation_steps)
    phases = []
    for i, data_dir in enumerate(d for d in (s.data, s.phase2_data) if d is not None):
        dataset = refuse_longer_than_positions(PretrainingDataset(data_dir, seed=s.dynamic_masking_seed), config,
                                               "--data" if i == 0 else "--phase2-data")
        phases.append(Phase(BatchPlan(dataset, micro, collate, seed=s.seed, rank=rank, world_size=world_size),
                            0, name=f"phase{i + 1}-{dataset.max_seq_length}"))
    if s.dynamic_masking_seed is not None and not any(p.plan.dataset.dynamic for p in phases):
        # static instances carry their masks: the seed would change nothing, without a word
        raise BertkitError(f"--dynamic-masking-seed {s.dynamic_masking_seed} seeds masks drawn at load time, but "
                           "the instances in "
                           f"{' and '.join(str(d) for d in (s.data, s.phase2_data) if d is not None)} carry the masks "
                           "create-pretraining-data drew (--masking static): drop --dynamic-masking-seed, or make the "
                           "data with --masking dynamic")
    if len(phases) == 1:
        phases[0].steps = s.max_steps
    else:
        phases[0].steps = max(1, round(s.max_steps * s.phase1_fraction))
        phases[1].steps = s.max_steps - phases[0].steps
        if phases[1].steps < 1:
            raise BertkitError(f"max_steps {s.max_steps} with phase1_fraction {s.phase1_fraction} leaves phase 2 empty")
    return phases


def refuse_longer_than_positions(dataset: PretrainingDataset, config: BertConfig, flag: str) -> PretrainingDataset:
    """``dataset``, refused before any step when its instances are longer than the model has positions for (found at
    the first evaluation, that was after the whole run's training, with no final model saved)."""
    if dataset.max_seq_length > config.max_position_embeddings:
        raise BertkitError(
            f"{flag} {dataset.path} holds instances of {dataset.max_seq_length} tokens but max_position_embeddings is "
            f"{config.max_position_embeddings}; recreate the data with --max-seq-length "
            f"{config.max_position_embeddings} or less, or enlarge the config"
        )
    return dataset


def held_out_evaluator(s: PretrainSettings, pad_id: int, config: BertConfig) -> Callable[[Any], dict] | None:
    """MLM and NSP accuracy on ``eval_data`` (None without it), as the loop calls it."""
    if s.eval_data is None:
        return None
    eval_set = refuse_longer_than_positions(PretrainingDataset(s.eval_data, seed=None), config, "--eval-data")

    def evaluate(model):
        return evaluate_pretraining(model, eval_set, batch_size=s.eval_batch_size, pad_id=pad_id,
                                    limit=s.eval_instances, device=process_device(s.device))

    return evaluate


def initial_model(s: PretrainSettings, config: BertConfig, first_phase: Phase) -> BertForPreTraining | BertForMaskedLM:
    """The model before its first step, seeded by ``s.seed``: ``init_from``'s weights, or new ones with the
    chosen MLM bias and position initialisation."""
    head = BertForPreTraining if s.nsp else BertForMaskedLM
    torch.manual_seed(s.seed)  # the initial weights are part of the run: same seed, same model
    if s.init_from is not None:  # heads the checkpoint lacks are initialised (seeded) and logged by name
        return head.from_pretrained(s.init_from, config=config)
    model = head(config)
    if s.mlm_bias_init == "unigram":
        with torch.no_grad():
            model.cls.predictions.bias.copy_(unigram_log_prior(first_phase.plan.dataset, config.vocab_size))
    if s.position_init == "sinusoidal":
        with torch.no_grad():
            model.bert.embeddings.position_embeddings.weight.copy_(sinusoidal_positions(
                config.max_position_embeddings, config.hidden_size, config.initializer_range))
    return model


def _weights_digest(directory: Path) -> str | list[str]:
    """The sha256 of a checkpoint's weights file (a list, one per shard, for a sharded checkpoint)."""
    digests = [sha256_of(f) for f in weight_files(directory)]
    return digests[0] if len(digests) == 1 else digests


def resume_fingerprint(s: PretrainSettings, config: BertConfig, phases: list[Phase]) -> dict:
    """What a checkpoint must have been trained with for ``resume`` to continue it."""
    fresh = s.init_from is None  # with --init-from the checkpoint's MLM bias and positions are kept
    # which steps train on which data, and the masks dynamic masking draws; recorded only where they are set, so that
    # a checkpoint written before they were recorded still resumes
    split = {"phase1_fraction": s.phase1_fraction if len(phases) > 1 else None,
             "dynamic_masking_seed": s.dynamic_masking_seed}
    return {"model_config": config.to_dict(), "max_steps": s.max_steps, "batch_size": s.batch_size,
            # the data's content (the manifest lists every shard's sha256), not its path: data
            # regenerated at the same path must not resume silently, data moved elsewhere may
            "data": [sha256_of(Path(p.plan.dataset.path) / MANIFEST) for p in phases],
            **{k: v for k, v in split.items() if v is not None},
            "mlm_bias_init": s.mlm_bias_init if fresh else None,
            "position_init": s.position_init if fresh else None, "nsp": s.nsp,
            "init_from": None if fresh else _weights_digest(s.init_from)}


def write_pretraining_results(s: PretrainSettings, model: Any, tokenizer: BertTokenizer, result: TrainResult) -> None:
    """The final model and tokenizer (``output_dir/final``), ``summary.json`` and ``metrics.png``."""
    final = s.output_dir / "final"
    model.save_pretrained(final)
    tokenizer.save_pretrained(final)
    atomic_write_json(s.output_dir / "summary.json",
                      {"steps": result.step, "last_eval": result.last_eval, "final_model": final.name})
    plot_metrics(s.output_dir / "metrics.jsonl", s.output_dir / "metrics.png")


def pretrain(s: PretrainSettings) -> TrainResult:
    """Pre-train ``BertForPreTraining`` (``BertForMaskedLM`` with ``nsp=False``) from scratch, or from
    ``init_from``, into ``output_dir`` (``write_pretraining_results``)."""
    tokenizer = BertTokenizer.from_pretrained(s.vocab.parent if s.vocab.is_file() else s.vocab)
    config = pretraining_config(s, tokenizer)
    pad = tokenizer.pad_token_id
    info = current()
    collate = functools.partial(collate_instances, pad_id=pad, nsp=s.nsp)  # picklable, for DataLoader workers
    phases = pretraining_phases(s, config, collate, rank=info.rank, world_size=info.world_size)
    evaluate = held_out_evaluator(s, pad, config)
    model = initial_model(s, config, phases[0])
    # Each checkpoint gets the tokenizer too: a checkpoint opens as a model (fine-tuned, served, made a SPLADE
    # encoder) as transformers' Trainer checkpoints do, not only the final model.
    result = train(model, phases, s.training(), evaluate=evaluate, batch_metrics=mlm_nsp_batch_metrics,
                   fingerprint=resume_fingerprint(s, config, phases), resume=s.resume,
                   hooks=LoopHooks(write_extra=tokenizer.save_pretrained))
    if info.is_main:  # under torchrun, rank 0 writes the results
        write_pretraining_results(s, model, tokenizer, result)
    return result
