"""The paper's feature-based NER study (section 5.3, Table 7): a BiLSTM tagger, trained on each of six combinations
of frozen BERT layers' activations (each word's first WordPiece, all L + 1 layers, extracted once to fp16 on disk)
and scored with conlleval on dev (docs/token-tasks.md).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.nn.utils.rnn import pad_sequence

from bertkit.errors import BertkitError, NonFiniteError
from bertkit.features import length_batches, run_batches
from bertkit.heads import IGNORE_INDEX
from bertkit.inference.runner import run_length_sorted
from bertkit.modeling import BertModel
from bertkit.outputs import atomic_target, atomic_write_json, placed
from bertkit.partial_output import file_identity, model_identity, refuse_other_plan
from bertkit.settings import STUDY_COMBINATIONS, StudySettings, TrainingSettings, first, resume_fingerprint
from bertkit.tasks import ner
from bertkit.tasks.metrics import to_fractions
from bertkit.training.finetune_run import remove_checkpoints, run_finetuning

logger = logging.getLogger("bertkit")

# The defaults of a direct call (the command passes its settings'): the tagger and the extraction.
LSTM_LAYERS = 2
DROPOUT = 0.25
MAX_SEQ_LENGTH = 128
EXTRACT_BATCH_SIZE = 64
# What --resume takes from a study cut short: runs/NAME/row.json, a finished combination's row, as it is; inputs.json,
# the data and model files the study was made from, which the resumed one must share
ROW, INPUTS = "row.json", "inputs.json"


# name -> (how to combine, which of the L + 1 hidden states: a slice of them). Taking one layer is the
# concatenation of one. The paper's "all 12 layers" are the Transformer layers; the embeddings are their own row.
COMBINATIONS: dict[str, tuple[str, slice]] = {
    "embeddings": ("concat", slice(0, 1)),
    "second_to_last_hidden": ("concat", slice(-2, -1)),
    "last_hidden": ("concat", slice(-1, None)),
    "weighted_sum_last_four": ("scalar_mix", slice(-4, None)),
    "concat_last_four": ("concat", slice(-4, None)),
    "weighted_sum_all_layers": ("scalar_mix", slice(1, None)),
}
assert tuple(COMBINATIONS) == STUDY_COMBINATIONS  # the settings name the same rows

# BERT-BASE dev F1 from the paper's Table 7, for the report.
PAPER_TABLE7 = {"finetuning": 96.4, "embeddings": 91.0, "second_to_last_hidden": 95.6, "last_hidden": 94.9,
                "weighted_sum_last_four": 95.9, "concat_last_four": 96.1, "weighted_sum_all_layers": 95.5}


def combination_layers(name: str, num_states: int) -> list[int]:
    """Positions in the L + 1 hidden states that combination ``name`` reads, in ascending order."""
    if name not in COMBINATIONS:
        raise BertkitError(f"unknown layer combination {name!r}; choose from {list(COMBINATIONS)}")
    which = COMBINATIONS[name][1]
    if which.start < 0 and num_states + which.start < 1:  # counted from the end: Transformer layers only
        raise BertkitError(f"{name} needs {-which.start} Transformer layers; this model has {num_states - 1}")
    return list(range(num_states))[which]


class LayerCombination(nn.Module):
    """(B, T, k, H) activations of k chosen layers -> (B, T, D) tagger input.

    ``concat`` joins the k layers in order (D = kH); ``scalar_mix`` is ELMo's (Peters et al. 2018, eq. 1):
    gamma * sum_j softmax(w)_j h_j, with w (k,) and gamma learned and initialised to 0 (equal weights) and 1.
    """

    def __init__(self, mode: str, num_layers: int, hidden_size: int):
        super().__init__()
        assert mode in ("concat", "scalar_mix"), mode
        self.mode = mode
        self.output_size = hidden_size * num_layers if mode == "concat" else hidden_size
        if mode == "scalar_mix":
            self.weights = nn.Parameter(torch.zeros(num_layers))
            self.gamma = nn.Parameter(torch.ones(()))

    def forward(self, x: Tensor) -> Tensor:
        if self.mode == "concat":
            return x.flatten(-2)  # (B, T, k * H), layers in the order given
        return self.gamma * torch.einsum("k,...kh->...h", self.weights.softmax(0), x)


# How the taggers train, beside the settings a user sets (StudySettings): Adam (AdamW without weight decay, eps as
# torch.optim.Adam's), no warm-up, the loop's linear decay to 0, and the global gradient norm clipped at 5, as is
# usual for LSTM taggers (Lample et al. 2016).
TAGGER_TRAINING = {"weight_decay": 0.0, "warmup_ratio": 0.0, "max_grad_norm": 5.0, "adam_epsilon": 1e-8}


@dataclass
class TaggerOutput:
    loss: Tensor | None  # mean cross-entropy over real words; None without labels
    logits: Tensor  # (B, T, C); rows past a sentence's length are padding


class BiLSTMTagger(nn.Module):
    """Layer combination -> dropout -> multi-layer BiLSTM -> dropout -> linear, one tag per word (no CRF,
    as in the paper's section 5.3). Called as the heads are: ``tagger(features, attention_mask, labels)``."""

    def __init__(self, combination: LayerCombination, lstm_hidden: int, num_labels: int, *,
                 num_layers: int = LSTM_LAYERS, dropout: float = DROPOUT):
        super().__init__()
        self.combination = combination
        self.dropout = nn.Dropout(dropout)
        self.lstm = nn.LSTM(combination.output_size, lstm_hidden, num_layers=num_layers, batch_first=True,
                            bidirectional=True, dropout=dropout if num_layers > 1 else 0.0)
        self.classifier = nn.Linear(2 * lstm_hidden, num_labels)

    def forward(self, features: Tensor, attention_mask: Tensor, labels: Tensor | None = None) -> TaggerOutput:
        """features (B, T, k, H) word activations, attention_mask (B, T) 1 at words (each row's words first),
        labels (B, T) tag ids with IGNORE_INDEX at padding."""
        lengths = attention_mask.sum(1).cpu()  # (B,)
        h = self.dropout(self.combination(features))  # (B, T, D)
        packed = nn.utils.rnn.pack_padded_sequence(h, lengths, batch_first=True, enforce_sorted=False)
        y, _ = self.lstm(packed)
        y, _ = nn.utils.rnn.pad_packed_sequence(y, batch_first=True, total_length=features.size(1))  # (B, T, 2h)
        logits = self.classifier(self.dropout(y))  # (B, T, C)
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)), labels.reshape(-1), ignore_index=IGNORE_INDEX)
        return TaggerOutput(loss, logits)


@dataclass
class WordActivations:
    """``values`` (words, L + 1, H) fp16; sentence i's words are rows ``offsets[i]:offsets[i + 1]``."""

    values: np.ndarray
    offsets: np.ndarray


@torch.no_grad()
def extract_word_activations(model: BertModel, tokenizer: Any, sentences: Sequence[ner.NerSentence],
                             path: Path, *, max_seq_length: int | None = None,
                             batch_size: int = EXTRACT_BATCH_SIZE,
                             device: str = "cpu", progress: bool = True) -> WordActivations:
    """All L + 1 hidden states at each word's first WordPiece, written to ``path`` (.npy, fp16) and memory-mapped.
    Each sentence is encoded alone (``ner.featurize_ner`` windows of ``max_seq_length`` tokens, None: 128 within the
    model's positions; long ones split at word boundaries)."""
    if max_seq_length is None:  # a checkpoint of fewer positions is windowed at them, as extract_features cuts texts
        max_seq_length = min(MAX_SEQ_LENGTH, model.config.max_position_embeddings)
    labels = ner.label_list(sentences)
    features = ner.featurize_ner(sentences, tokenizer, labels, max_seq_length)
    num_states, H = model.config.num_hidden_layers + 1, model.config.hidden_size
    offsets = _offsets(sentences)
    with atomic_target(path) as tmp:  # never through a symlink; a kill leaves no half-written array under its name
        _fill_word_activations(model, features, offsets, tmp, num_states, H, batch_size, device, progress)
    return WordActivations(np.load(path, mmap_mode="r"), offsets)


def _offsets(sentences: Sequence[ner.NerSentence]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum([len(s.words) for s in sentences])]).astype(np.int64)


def _fill_word_activations(model: BertModel, features: list[dict], offsets: np.ndarray, tmp: Path, num_states: int,
                           H: int, batch_size: int, device: str, progress: bool) -> None:
    from bertkit.progress import progress_bar

    values = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.float16, shape=(int(offsets[-1]), num_states, H))
    model.eval().to(device)
    bar = progress_bar(total=len(features), enabled=progress, unit="window", dynamic_ncols=True)
    encoded = [{"input_ids": f["input_ids"], "token_type_ids": f["token_type_ids"]} for f in features]
    for start in range(0, len(features), 4096):
        idx = list(range(start, min(start + 4096, len(features))))
        states_of = run_batches(model, encoded, length_batches(encoded, idx, batch_size), range(num_states), device, bar)
        for i in idx:
            f, states = features[i], states_of[i]
            pos = [p for p, w in enumerate(f["word_ids"]) if w is not None]
            rows = offsets[f["sentence_index"]] + np.asarray([f["word_ids"][p] for p in pos])
            with np.errstate(over="ignore"):
                words = states[:, pos].transpose(1, 0, 2).astype(np.float16)  # (words, L + 1, H)
            if not np.isfinite(words).all():  # a tagger trained or scored on them: an argmax of NaN is a tag
                _refuse_nonfinite(states[:, pos], f["sentence_index"])
            values[rows] = words
    bar.close()
    values.flush()
    del values


def _refuse_nonfinite(states: np.ndarray, sentence: int) -> None:
    """Raise for float32 word ``states`` (L + 1, words, H) of ``sentence`` that are not finite, or not in float16."""
    with np.errstate(over="ignore"):
        layer = int(np.argmin([np.isfinite(s.astype(np.float16)).all() for s in states]))
    where = f"sentence {sentence} (0-based, file order): layer {layer} of its word activations holds"
    if np.isfinite(states[layer]).all():
        raise NonFiniteError(f"{where} values past float16's range (largest {np.abs(states[layer]).max():.1e}), in "
                             "which the study keeps activations; the model's activations overflow: study a checkpoint "
                             "whose activations stay below 65504; nothing was written")
    raise NonFiniteError(f"{where} NaN or infinite values: the model's weights are broken; nothing was written")


def _batch(acts: np.ndarray, offsets: np.ndarray, sentence_ids: Sequence[int], tag_ids: Sequence[np.ndarray] | None
           ) -> dict[str, Tensor]:
    """The tagger's inputs: ``features`` (B, T, k, H) float32, ``attention_mask`` (B, T) and, with ``tag_ids``,
    ``labels`` (B, T) padded with IGNORE_INDEX."""
    rows = [torch.from_numpy(acts[offsets[i]:offsets[i + 1]].astype(np.float32)) for i in sentence_ids]
    batch = {"features": pad_sequence(rows, batch_first=True),
             "attention_mask": pad_sequence([torch.ones(len(r), dtype=torch.long) for r in rows], batch_first=True)}
    if tag_ids is not None:
        batch["labels"] = pad_sequence([torch.as_tensor(tag_ids[i], dtype=torch.long) for i in sentence_ids],
                                       batch_first=True, padding_value=IGNORE_INDEX)
    return batch


def _tag(tagger: BiLSTMTagger, acts: np.ndarray, offsets: np.ndarray, labels: Sequence[str], batch_size: int,
         device: str) -> list[list[str]]:
    """Predicted tags of every sentence, through the one evaluation loop (``inference.runner``), in fp32."""
    lengths = np.diff(offsets).tolist()

    def call(batch: dict[str, Tensor], ids: Sequence[int]) -> list[np.ndarray]:
        pred = tagger(**batch).logits.argmax(-1).cpu().numpy()
        return [pred[row, :lengths[i]] for row, i in enumerate(ids)]

    tags = run_length_sorted(call, range(len(lengths)), batch_size=batch_size * 4, lengths=lengths, device=device,
                             pad=lambda ids: _batch(acts, offsets, ids, None), model=tagger)
    return [[labels[j] for j in t] for t in tags]


def train_tagger(name: str, s: StudySettings, train_acts: WordActivations, dev_acts: WordActivations,
                 train_tags: Sequence[np.ndarray], dev_sentences: Sequence[ner.NerSentence], labels: Sequence[str],
                 hidden_size: int) -> dict[str, Any]:
    """Train one BiLSTM tagger on combination ``name``; dev conlleval after every epoch."""
    layers = combination_layers(name, train_acts.values.shape[1])
    mode = COMBINATIONS[name][0]
    # Only this combination's layers, in memory as fp16: 0.4 GB per layer for CoNLL-2003 train at H=384 ... x k.
    train_x = np.ascontiguousarray(train_acts.values[:, layers])
    dev_x = np.ascontiguousarray(dev_acts.values[:, layers])
    torch.manual_seed(s.seed)
    lstm_hidden = s.lstm_hidden or hidden_size // 2
    tagger = BiLSTMTagger(LayerCombination(mode, len(layers), hidden_size), lstm_hidden, len(labels),
                          num_layers=s.lstm_layers, dropout=s.dropout)
    n = len(train_acts.offsets) - 1
    steps_per_epoch = -(-n // s.batch_size)
    args = TrainingSettings(output_dir=s.output_dir / "runs" / name, learning_rate=s.learning_rate,
                            num_train_epochs=s.num_train_epochs, batch_size=s.batch_size, seed=s.seed,
                            logging_steps=steps_per_epoch, device=s.device, progress=s.progress, **TAGGER_TRAINING)

    def evaluate(module: nn.Module) -> dict[str, Any]:
        scores = to_fractions(ner.conlleval([x.tags for x in dev_sentences],
                                            _tag(module, dev_x, dev_acts.offsets, labels, s.batch_size, args.device)))
        record: dict[str, Any] = {k: scores[k] for k in ("f1", "precision", "recall")}
        if mode == "scalar_mix":
            record["layer_weights"] = [round(w, 4) for w in module.combination.weights.detach().softmax(0).tolist()]
            record["gamma"] = round(module.combination.gamma.detach().item(), 4)
        return record

    collate = functools.partial(_batch, train_x, train_acts.offsets, tag_ids=train_tags)
    # resumed: from the tagger's last checkpoint where a kill cut it short (none: trained from the start)
    run = run_finetuning(tagger, list(range(n)), collate, args, evaluate,
                         fingerprint={"feature_study": name, "layers": layers}, resume=s.resume)
    train_loss = [r["loss"] for r in run.result.history if r["split"] == "train"]
    per_epoch = [{"epoch": epoch + 1, "train_loss": loss, **{f"dev_{k}": ev[k] for k in ("f1", "precision", "recall")},
                  **{k: ev[k] for k in ("layer_weights", "gamma") if k in ev}}
                 for epoch, (loss, ev) in enumerate(zip(train_loss, run.per_epoch))]
    logger.info("feature-study %s: dev F1 %.4f (%.0fs)", name, per_epoch[-1]["dev_f1"], run.seconds)
    row = {"combination": name, "layers": layers, "dev_f1": per_epoch[-1]["dev_f1"], "per_epoch": per_epoch,
           "seconds": round(run.seconds, 1)}
    atomic_write_json(args.output_dir / ROW, row)  # the row of the table, kept for a resume, before the checkpoints go
    remove_checkpoints(args)  # the tagger is scored on dev already: its final evaluation is the row of the table
    return row


def _check_inputs(s: StudySettings) -> None:
    """Record the files the study reads (size and modification time) and its settings; with ``s.resume``, refuse a
    study whose data or model files changed since the run cut short read them, or whose settings differ (the command
    line's marker checks them too; called from Python, this is the one check): its activations and rows are of those."""
    settings = resume_fingerprint(s)
    del settings["output_dir"]  # where it is written: the command writes it aside, then moves it into place
    now = {"data": {name: file_identity(s.data_dir.absolute() / name) for name in ("train.txt", "valid.txt")},
           "model": model_identity(s.model_name_or_path), "settings": settings}
    path = s.output_dir / INPUTS
    if s.resume and path.is_file():
        earlier = json.loads(path.read_text(encoding="utf-8"))
        refuse_other_plan(f"in {placed(s.output_dir)}", "feature-study", earlier, now,
                          {"data": ("was cut short with other data files", "data files"),
                           "model": ("was cut short with another model", "model"),
                           "settings": ("had other settings", "settings")},
                          "start again (only the files bertkit wrote there are removed), or choose another output "
                          "directory")
    else:
        atomic_write_json(path, now)


def _resumed_activations(s: StudySettings, split: str, sentences: Sequence[ner.NerSentence], num_states: int,
                         hidden_size: int) -> WordActivations | None:
    """With ``s.resume``, the activations a run cut short wrote (each whole: ``atomic_target``), where they have the
    shape these sentences and this model give; else None (extracted)."""
    path = s.output_dir / "activations" / f"{split}.npy"
    if not s.resume or not path.is_file():
        return None
    offsets = _offsets(sentences)
    values = np.load(path, mmap_mode="r")
    if values.shape != (int(offsets[-1]), num_states, hidden_size):
        return None
    logger.info("feature-study: %s's activations as the run cut short extracted them (%s)", split, path)
    return WordActivations(values, offsets)


def _resumed_row(s: StudySettings, name: str) -> dict[str, Any] | None:
    """With ``s.resume``, the row of combination ``name`` a run cut short finished; else None (trained)."""
    path = s.output_dir / "runs" / name / ROW
    if not s.resume or not path.is_file():
        return None
    logger.info("feature-study %s: the row the run cut short finished (%s)", name, path)
    return json.loads(path.read_text(encoding="utf-8"))


def feature_study(s: StudySettings) -> dict[str, Any]:
    """Table 7 on CoNLL-2003 dev: writes ``activations/`` and ``report.json`` with the dev F1 table (last epoch;
    every epoch's in ``runs``), settings and timings. With ``s.resume`` a run a kill cut short goes on (the command
    line checks that its settings are that run's): the activations and the combinations it finished are taken as
    they are, a tagger it cut short goes on from its last checkpoint."""
    from bertkit.features import max_seq_length_for, text_form
    from bertkit.tokenization import BertTokenizer

    form = text_form(s.model_name_or_path)  # a sentence-transformers directory: the text its model sees
    if form.prompt:
        raise BertkitError(f"{s.model_name_or_path} puts the prompt {form.prompt!r} before every text "
                           "(config_sentence_transformers.json's default_prompt_name), which the study's word "
                           "activations would leave out; set default_prompt_name to null there to study the encoder "
                           "on bare sentences, or use extract-features, which puts it in")
    tokenizer = BertTokenizer.from_pretrained(form.encoder_dir)
    model = BertModel.from_pretrained(form.encoder_dir)
    # windows longer than the directory's max_seq_length are refused: its model never sees more of a text
    max_seq_length = max_seq_length_for(s.max_seq_length, form, tokenizer, model.config.max_position_embeddings)
    # before the extraction: its forward pass refused the first window that long, naming no flag of this command
    model.config.check_sequence_length(max_seq_length, "--max-seq-length", str(s.model_name_or_path))
    num_states = model.config.num_hidden_layers + 1
    for name in s.combinations:
        combination_layers(name, num_states)  # fail before the long extraction
    train_all = ner.read_conll(s.data_dir / "train.txt", s.tag_scheme)
    dev = ner.read_conll(s.data_dir / "valid.txt", s.tag_scheme)
    if form.lowercase:  # sentence_bert_config.json's do_lower_case: each word as the lowered sentence holds it
        train_all, dev = ([dataclasses.replace(x, words=tuple(map(tokenizer.lowercase, x.words))) for x in split]
                          for split in (train_all, dev))
    train = first(train_all, s.max_train_samples)
    labels = ner.training_labels(train_all, s.data_dir / "train.txt")
    label_id = {t: i for i, t in enumerate(labels)}
    _check_inputs(s)
    (s.output_dir / "activations").mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    train_acts, dev_acts = (_resumed_activations(s, split, sentences, num_states, model.config.hidden_size)
                            or extract_word_activations(
        model, tokenizer, sentences, s.output_dir / "activations" / f"{split}.npy", max_seq_length=max_seq_length,
        batch_size=s.extract_batch_size, device=s.device, progress=s.progress)
        for split, sentences in (("train", train), ("dev", dev)))
    extract_seconds = time.perf_counter() - t0
    train_tags = [np.asarray([label_id[t] for t in x.tags]) for x in train]
    rows = [_resumed_row(s, name) or train_tagger(name, s, train_acts, dev_acts, train_tags, dev, labels,
                                                  model.config.hidden_size)
            for name in s.combinations]
    settings = {k: (str(v) if isinstance(v, Path) else v) for k, v in dataclasses.asdict(s).items()}
    settings["lstm_hidden"] = s.lstm_hidden or model.config.hidden_size // 2
    settings["max_seq_length"] = max_seq_length  # the windows the activations were extracted in
    report = {
        "task": "feature_based_ner", "model": str(s.model_name_or_path), "split": "CoNLL-2003 dev (valid.txt)",
        "table": {r["combination"]: r["dev_f1"] for r in rows}, "runs": rows,
        "train_sentences": len(train), "dev_sentences": len(dev),
        "extract_seconds": round(extract_seconds, 1), "total_seconds": round(time.perf_counter() - t0, 1),
        "subset": None if len(train) == len(train_all) else
        f"the first {len(train)} of the {len(train_all)} training sentences",
        "settings": settings,
    }
    atomic_write_json(s.output_dir / "report.json", report)
    return report


def format_table(report: dict[str, Any]) -> str:
    """The report's dev F1 table as Markdown (percent, as the paper prints it), with BERT-BASE's beside it."""
    lines = ["| layers | dev F1 | paper (BERT-BASE) |", "|---|---:|---:|"]
    for name, f1 in report["table"].items():
        lines.append(f"| {name} | {100 * f1:.1f} | {PAPER_TABLE7.get(name, '-')} |")
    return "\n".join(lines)

