"""Fine-tuning recipes for the token-level and span tasks (NER, SQuAD v1.1/v2.0, SWAG) and their predict commands,
which run a fine-tuned checkpoint through the same prediction and scoring code. Each recipe trains through
``finetune_run.run_finetuning``, scores with the task's official-equivalent scorer, saves the model and tokenizer
under ``out_dir/model`` and writes predictions and ``report.json``. Defaults: docs/token-tasks.md.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from bertkit.config import BertConfig
from bertkit.data.collate import collate
from bertkit.errors import BertkitError
from bertkit.heads import BertForMultipleChoice, BertForQuestionAnswering, BertForTokenClassification
from bertkit.inference.predict import EVAL_BATCH_SIZE, for_prediction, predict
from bertkit.outputs import atomic_write, atomic_write_json, json_text
from bertkit.quantization import load_for_inference, require_head
from bertkit.settings import (
    FinetuneSettings,
    NerSettings,
    PredictBenchmarkSettings,
    PredictNerSettings,
    PredictSquadSettings,
    PredictSwagSettings,
    SquadSettings,
    SwagSettings,
    first,
)
from bertkit.tasks import ner, squad, squad_eval, swag
from bertkit.tasks.metrics import to_fractions
from bertkit.tokenization import BertTokenizer
from bertkit.training.distributed import current, process_device
from bertkit.training.finetune_run import checkpoint_tokenizer, remove_checkpoints, run_finetuning

logger = logging.getLogger("bertkit")

# SQuAD post-processing in a direct call (run_squad.py's; the commands pass their settings').
N_BEST_SIZE = 20
MAX_ANSWER_LENGTH = 30
NULL_THRESHOLD = 0.0


def _evaluated_on(source: str, kept: int, total: int, unit: str) -> str:
    """What the dev scores are of: ``source`` and, where --max-eval-samples cut it, the first ``kept`` rows."""
    if kept < total:
        source += f" Only the first {kept} of these {total} {unit} are scored (--max-eval-samples)."
    return source


def _finetune(cls: type[nn.Module], s: FinetuneSettings, train_features: Sequence[dict],
              dev: Callable[[nn.Module], tuple[Any, dict]] | None, task: str,
              finish: Callable[[nn.Module, BertTokenizer, dict, Any], dict], tokenizer: BertTokenizer, subset: str,
              *, evaluate: bool = True, **model_kwargs: Any) -> dict[str, Any]:
    """Train the head ``cls``; on rank 0, ``finish`` adds the scores and prediction files to the report and the model
    is saved under ``output_dir/model``. ``dev(model)`` gives the dev predictions and the metrics the loop logs
    (after every epoch, with ``evaluate``); ``finish`` receives the final weights' dev predictions (the final
    evaluation's when this process ran it: no second pass over dev)."""
    torch.manual_seed(s.seed)  # the fresh head's initialisation depends on the seed
    model = cls.from_pretrained(s.model_name_or_path, **model_kwargs)
    lr = s.learning_rate_for(model.config.hidden_size)
    s.output_dir.mkdir(parents=True, exist_ok=True)
    newest: list[Any] = []  # the predictions of this process's newest evaluation

    def evaluated(m: nn.Module) -> dict:
        predictions, metrics = dev(m)
        newest[:] = [predictions]
        return metrics

    settings = s.training(learning_rate=lr)
    run = run_finetuning(model, train_features, lambda b: collate(b, tokenizer.pad_token_id), settings,
                         evaluated if dev is not None and evaluate else None,
                         {"model": str(s.model_name_or_path), "task": task}, s.resume)
    if not current().is_main:  # under torchrun, rank 0 predicts, saves and reports
        return {}
    report = {"task": task, "model": str(s.model_name_or_path), "lr": lr, "epochs": run.epochs,
              "batch_size": s.batch_size, "steps": run.result.step, "train_seconds": round(run.seconds, 1),
              "per_epoch": run.per_epoch}
    # This process's evaluations are the newest records, so its last one ran on the final weights exactly when the
    # newest evaluation record is at the final step (a resumed run may have evaluated there before the kill).
    final = bool(newest) and bool(run.per_epoch) and run.per_epoch[-1]["step"] == run.result.step
    dev_predictions = newest[0] if final else dev(model)[0] if dev is not None else None
    files = finish(model, tokenizer, report, dev_predictions)
    model.config.extra["max_seq_length"] = s.max_seq_length  # predict's default length (config.json keeps the key)
    model_dir = model.save_pretrained(s.output_dir / "model")
    tokenizer.save_pretrained(model_dir)
    report.update(subset=None if s.max_train_samples is None else f"the first {subset}",
                  files={**files, "model": str(model_dir)}, settings=s.as_dict())
    atomic_write_json(s.output_dir / "report.json", report)
    remove_checkpoints(settings)
    return report


def load_finetuned(cls: type[nn.Module], s: PredictBenchmarkSettings, task: str) -> tuple[nn.Module, BertTokenizer, Any]:
    """A checkpoint fine-tuned for ``task``, ready to predict (``for_prediction``), its tokenizer and precision."""
    path = s.model_name_or_path
    head = "qa_outputs.weight" if cls is BertForQuestionAnswering else "classifier.weight"
    if not (path / "config.json").is_file():
        raise BertkitError(f"{path / 'config.json'} not found: pass the model directory a finetune {task} run wrote")
    require_head(path, cls, (head,), task, f"pass a checkpoint fine-tuned with `bertkit finetune {task}`")
    s.take_fine_tuned_length(path / "config.json")
    tokenizer = BertTokenizer.from_pretrained(path)
    model, precision = for_prediction(load_for_inference(cls, path), tokenizer, s)
    return model, tokenizer, precision


def prediction_report(s: PredictBenchmarkSettings, precision: Any, report: dict) -> dict[str, Any]:
    report = {"model": str(s.model_name_or_path), **report, "max_seq_length": s.max_seq_length, **precision.record()}
    atomic_write_json(s.output_dir / "report.json", report)
    return report


# -- NER (CoNLL-2003) -------------------------------------------------------------------------------------------------


NER_SPLITS = {"train": "train.txt", "dev": "valid.txt", "test": "test.txt"}


def predict_ner(model: nn.Module, sentences: Sequence[ner.NerSentence], features: Sequence[dict],
                labels: Sequence[str], *, pad_id: int, batch_size: int = EVAL_BATCH_SIZE, bf16: bool = False,
                device: str = "cpu") -> list[list[str]]:
    """One predicted tag per word of every sentence (read at each word's first WordPiece)."""
    rows = predict(model, features, pad_id, batch_size=batch_size, bf16=bf16, device=device)
    return ner.align_predictions(features, [r.argmax(-1) for r in rows], labels, num_sentences=len(sentences))


def ner_scores(sentences: Sequence[ner.NerSentence], predicted: Sequence[Sequence[str]]) -> dict[str, Any]:
    """conlleval's overall precision/recall/F1/accuracy plus its per-type block, as fractions in [0, 1]."""
    return to_fractions(ner.conlleval([s.tags for s in sentences], predicted))


def finetune_ner(s: NerSettings) -> dict[str, Any]:
    """Fine-tune on CoNLL-2003 NER: dev F1 after every epoch, dev and test at the end, and their predictions in
    conlleval's input (``predictions_{dev,test}.txt``: word gold pred)."""
    tokenizer, s = checkpoint_tokenizer(s)
    data = {split: ner.read_conll(s.data_dir / name, s.tag_scheme) for split, name in NER_SPLITS.items()}
    n_dev = len(data["dev"])
    data["dev"] = first(data["dev"], s.max_eval_samples)
    train_sentences = first(data["train"], s.max_train_samples)
    # from all of train, so a subset run keeps the same head
    labels = ner.training_labels(data["train"], s.data_dir / NER_SPLITS["train"])
    # (after the training file, whose own refusal is the one to fix first)
    if all(t == "O" for sent in data["dev"] for t in sent.tags):  # every run's dev score would read 0.0
        rows, fix = ((f"--max-eval-samples {s.max_eval_samples} keeps {len(data['dev'])} dev sentences",
                      "pass a larger --max-eval-samples") if len(data["dev"]) < n_dev else
                     (f"{s.data_dir / NER_SPLITS['dev']} holds {n_dev} sentences", "score a dev file with entities"))
        raise BertkitError(f"{rows}, every tag O: with no entity to find, conlleval's (and seqeval's) precision, "
                           f"recall and F1 are 0.0 whatever is predicted; {fix}")
    tagged = BertConfig.from_pretrained(s.model_name_or_path).id2label
    if sorted(tagged.values()) == sorted(labels):  # a tagger of these labels (run_ner.py's order, say):
        labels = [tagged[i] for i in range(len(tagged))]  # each row of its head keeps its tag, as in run_ner.py
    for split in ("dev", "test"):
        unseen = sorted({t for sent in data[split] for t in sent.tags} - set(labels))
        if unseen:
            raise BertkitError(f"{s.data_dir / NER_SPLITS[split]} has tags {unseen} that {NER_SPLITS['train']} lacks: "
                               "the tagger learns the training data's entity types only; add sentences with them "
                               f"to {NER_SPLITS['train']}")
    feats = {split: ner.featurize_ner(sents, tokenizer, labels, s.max_seq_length)
             for split, sents in (("train", train_sentences), ("dev", data["dev"]), ("test", data["test"]))}

    def scored(model: nn.Module, split: str) -> tuple[list[list[str]], dict[str, Any]]:
        tags = predict_ner(model, data[split], feats[split], labels, pad_id=tokenizer.pad_token_id,
                           batch_size=s.eval_batch_size, bf16=s.bf16, device=process_device(s.device))
        return tags, ner_scores(data[split], tags)

    def dev(model: nn.Module) -> tuple[list[list[str]], dict[str, float]]:
        tags, scores = scored(model, "dev")
        return tags, {k: scores[k] for k in ("precision", "recall", "f1", "accuracy")}

    def finish(model: nn.Module, tokenizer: BertTokenizer, report: dict, dev_tags: list[list[str]]) -> dict[str, str]:
        dev, (test_tags, test) = ner_scores(data["dev"], dev_tags), scored(model, "test")
        source = f"{s.data_dir / NER_SPLITS['dev']}: all {n_dev} sentences."
        report.update(labels=labels, train_sentences=len(train_sentences), train_features=len(feats["train"]),
                      evaluated_on=_evaluated_on(source, len(data["dev"]), n_dev, "sentences"), dev=dev, test=test,
                      dev_per_epoch=report.pop("per_epoch"))
        logger.info("ner dev F1 %.4f test F1 %.4f", dev["f1"], test["f1"])
        return {"dev": str(ner.write_conll(s.output_dir / "predictions_dev.txt", data["dev"], dev_tags)),
                "test": str(ner.write_conll(s.output_dir / "predictions_test.txt", data["test"], test_tags))}

    return _finetune(BertForTokenClassification, s, feats["train"], dev, "ner", finish, tokenizer,
                     f"{len(train_sentences)} of the {len(data['train'])} training sentences",
                     # a tagger of another label count gets a fresh head of these tags, as finetune glue's does
                     id2label=dict(enumerate(labels)), ignore_mismatched_sizes=True)


def predict_ner_file(s: PredictNerSettings) -> dict[str, Any]:
    """Tag ``s.data_file`` with a fine-tuned checkpoint: predictions.txt (word gold pred) and conlleval scores."""
    model, tokenizer, precision = load_finetuned(BertForTokenClassification, s, "ner")
    labels = [model.config.id2label[i] for i in range(len(model.config.id2label))]
    not_tags = [label for label in labels if not ner.is_tag(label)]
    if not_tags:  # transformers' default names (LABEL_0, ...) or another task's: conlleval would find no entity
        raise BertkitError(f"{s.model_name_or_path}/config.json's id2label has labels that are not NER tags (O, B-TYPE, "
                           f"I-TYPE): {not_tags[:5]}; use a checkpoint fine-tuned for NER (`bertkit finetune ner`, "
                           "or one whose id2label names its tags)")
    sentences = first(ner.read_conll(s.data_file, s.tag_scheme), s.max_predict_samples)
    # Gold tags the model does not know get ids past its outputs: featurize accepts them, none is predicted.
    gold = sorted({t for sent in sentences for t in sent.tags} - set(labels))
    features = ner.featurize_ner(sentences, tokenizer, labels + gold, s.max_seq_length)
    tags = predict_ner(model, sentences, features, labels + gold, pad_id=tokenizer.pad_token_id,
                       batch_size=s.batch_size, bf16=precision.bf16, device=precision.device)
    path = ner.write_conll(s.output_dir / "predictions.txt", sentences, tags)
    return prediction_report(s, precision, {"task": "ner", "data_file": str(s.data_file), "sentences": len(sentences),
                                     "scores": ner_scores(sentences, tags), "files": {"predictions": str(path)}})


# -- SQuAD v1.1 / v2.0 ------------------------------------------------------------------------------------------------

def _squad_split(s: SquadSettings, dataset: dict) -> tuple[list, list, dict | None]:
    """(training articles, evaluation articles, a description of the split or None)."""
    if s.train_file is not None:
        return squad.load_squad(s.train_file)["data"], dataset["data"], None
    train_articles, heldout = squad.split_squad_articles(dataset, s.heldout_fraction, seed=s.split_seed)
    n_q = sum(len(p["qas"]) for a in heldout for p in a["paragraphs"])
    note = (f"NOT the official evaluation: no --train-file, so {s.predict_file.name} was split by article; "
            f"trained on {len(train_articles)} articles, scored on the {len(heldout)} held-out articles "
            f"({n_q} questions). Not comparable to published SQuAD dev scores.")
    split = {"note": note, "train_articles": len(train_articles), "heldout_articles": len(heldout),
             "heldout_questions": n_q, "heldout_titles": [a["title"] for a in heldout],
             "heldout_fraction": s.heldout_fraction, "split_seed": s.split_seed}
    logger.warning("%s", note)
    return train_articles, heldout, split


def predict_squad(model: nn.Module, examples: Sequence[squad.SquadExample], features: Sequence[dict], *,
                  pad_id: int, version: str = "1.1", n_best_size: int = N_BEST_SIZE,
                  max_answer_length: int = MAX_ANSWER_LENGTH, null_threshold: float = NULL_THRESHOLD,
                  batch_size: int = EVAL_BATCH_SIZE, bf16: bool = False, device: str = "cpu"
                  ) -> tuple[squad.SquadPredictions, list[np.ndarray]]:
    """Start/end logits per window, post-processed into answers; also returns the logits for re-thresholding."""
    rows = predict(model, features, pad_id, batch_size=batch_size, bf16=bf16, device=device,
                   output=lambda o: torch.stack([o.start_logits, o.end_logits], -1))
    return postprocess_squad(examples, features, rows, version, n_best_size, max_answer_length, null_threshold), rows


def postprocess_squad(examples, features, rows: Sequence[np.ndarray], version: str, n_best_size: int,
                      max_answer_length: int, null_threshold: float) -> squad.SquadPredictions:
    return squad.postprocess_predictions(
        examples, features, [r[:, 0] for r in rows], [r[:, 1] for r in rows], n_best_size=n_best_size,
        max_answer_length=max_answer_length, version_2_with_negative=version == "2.0",
        null_score_diff_threshold=null_threshold)


def squad_finetuning_examples(s: SquadSettings) -> tuple[list[squad.SquadExample], list[squad.SquadExample],
                                                              list[dict], dict | None]:
    """The training questions, the evaluation questions and their articles (the predict file, or its held-out
    articles without a training file), and how the file was split (None when it was not)."""
    dataset = squad.load_squad(s.predict_file)
    train_articles, eval_articles, split = _squad_split(s, dataset)
    train_examples = squad.squad_examples(train_articles, source=str(s.train_file or s.predict_file))
    eval_examples = squad.squad_examples(eval_articles, source=str(s.predict_file))
    for name, examples in (("training", train_examples), ("evaluation", eval_examples)):
        _refuse_unanswerable_in_v1(s.version, name, examples)
    return train_examples, eval_examples, eval_articles, split


def _refuse_unanswerable_in_v1(version: str, name: str, examples: Sequence[squad.SquadExample]) -> None:
    """SQuAD v1.1 trains on and scores (evaluate-v1.1.py) only questions with a gold answer."""
    bad = [e.qas_id for e in examples if e.is_impossible or not e.answers]
    if version == "1.1" and bad:
        raise BertkitError(f"the {name} data holds {len(bad)} unanswerable questions (e.g. {bad[:3]}), "
                           "which SQuAD v1.1 does not have; pass version '2.0' (--version 2.0)")


def questions_of(articles: Sequence[dict], examples: Sequence[squad.SquadExample]) -> list[dict]:
    """``articles`` with only the questions of ``examples``: those --max-eval-samples / --max-predict-samples kept
    are the ones scored, not counted wrong (evaluate-v1.1.py) nor refused as unanswered (evaluate-v2.0.py)."""
    wanted = {e.qas_id for e in examples}
    return [{**a, "paragraphs": [{**p, "qas": [q for q in p["qas"] if q["id"] in wanted]} for p in a["paragraphs"]]}
            for a in articles]


def official_scores(version: str, articles: Sequence[dict], preds: squad.SquadPredictions,
                    null_threshold: float = NULL_THRESHOLD) -> dict[str, Any]:
    """The official script's scores of ``preds`` as fractions in [0, 1]; for v2.0 with the null odds as its
    na_probs and ``null_threshold``, the one ``preds`` were answered at, as its ``--na-prob-thresh``.

    That threshold makes exact/f1 those of ``preds.predictions`` as written: a question is scored unanswered
    exactly when its null odds exceed it, as it was answered "". The script's default 1.0 (a probability's
    "never") scored an answer whose null odds lay between 1 and a higher threshold as unanswered (``predict squad
    --null-threshold 2``: a right answer at null odds 1.5 scored F1 0, where predictions.json scores 1)."""
    if version == "1.1":
        return to_fractions(squad_eval.evaluate_v1(articles, preds.predictions))
    return to_fractions(squad_eval.evaluate_v2(articles, preds.predictions, na_probs=preds.null_odds,
                                               na_prob_thresh=null_threshold))


def score_squad_finetuning(s: SquadSettings, articles: Sequence[dict], examples: Sequence[squad.SquadExample],
                           features: Sequence[dict], preds: squad.SquadPredictions, rows: Sequence[np.ndarray]
                           ) -> tuple[squad.SquadPredictions, dict[str, Any]]:
    """The official scores; for v2.0 at the null threshold that maximises F1 on these same predictions (as the
    paper selects it on dev), those at threshold 0 beside them. Returns the predictions scored and the scores."""
    if s.version == "1.1":
        return preds, official_scores(s.version, articles, preds)
    at_zero = squad_eval.evaluate_v2(articles, preds.predictions, na_probs=preds.null_odds,
                                     na_prob_thresh=NULL_THRESHOLD)  # the threshold predict_squad answered at
    threshold = at_zero["best_f1_thresh"]
    preds = postprocess_squad(examples, features, rows, s.version, s.n_best_size, s.max_answer_length, threshold)
    scores = official_scores(s.version, articles, preds, threshold)
    at_zero = to_fractions(at_zero)
    scores.update(null_threshold=threshold, at_threshold_0={k: at_zero[k] for k in ("exact", "f1")},
                  threshold_note="null threshold = best_f1_thresh chosen on these same predictions "
                                 "(as the paper selects it on dev): optimistic for this set")
    return preds, scores


def finetune_squad(s: SquadSettings) -> dict[str, Any]:
    """Fine-tune on SQuAD and score the predict file (or its held-out articles), writing the predictions in
    run_squad.py's formats."""
    tokenizer, s = checkpoint_tokenizer(s)
    all_train_examples, all_eval_examples, eval_articles, split = squad_finetuning_examples(s)
    train_examples = first(all_train_examples, s.max_train_samples)
    eval_examples = first(all_eval_examples, s.max_eval_samples)
    eval_articles = questions_of(eval_articles, eval_examples)
    shape = {"max_seq_length": s.max_seq_length, "doc_stride": s.doc_stride, "max_query_length": s.max_query_length}
    train_features = squad.featurize_squad(train_examples, tokenizer, **shape)
    eval_features = squad.featurize_squad(eval_examples, tokenizer, **shape)

    headline = ("exact_match", "f1") if s.version == "1.1" else ("exact", "f1")

    def dev(model: nn.Module) -> tuple[tuple[Any, ...], dict[str, float]]:
        """The held-out questions' predictions and scores: the run's final scores, and with --eval-strategy (or
        --eval-steps) the loop's evaluation records, which had been asked for and never written."""
        t0 = time.perf_counter()
        preds, rows = predict_squad(model, eval_examples, eval_features, pad_id=tokenizer.pad_token_id,
                                    version=s.version, n_best_size=s.n_best_size,
                                    max_answer_length=s.max_answer_length, batch_size=s.eval_batch_size,
                                    bf16=s.bf16, device=process_device(s.device))
        preds, scores = score_squad_finetuning(s, eval_articles, eval_examples, eval_features, preds, rows)
        return (preds, scores, time.perf_counter() - t0), {k: scores[k] for k in headline}

    def finish(model: nn.Module, tokenizer: BertTokenizer, report: dict, final: tuple[Any, ...]) -> dict[str, str]:
        if not report["per_epoch"]:  # no evaluation in the loop (the default): the final scores are the report's
            del report["per_epoch"]
        preds, scores, seconds = final
        source = split["note"] if split else f"{s.predict_file}: all {len(all_eval_examples)} questions."
        report.update(evaluated_on=_evaluated_on(source, len(eval_examples), len(all_eval_examples), "questions"),
                      scores=scores, split=split, predict_seconds=round(seconds, 1),
                      train_questions=len(train_examples), train_features=len(train_features),
                      eval_questions=len(eval_examples), eval_features=len(eval_features))
        logger.info("squad%s EM %.4f F1 %.4f on %s", s.version, scores[headline[0]], scores[headline[1]],
                    report["evaluated_on"])
        return {k: str(v) for k, v in preds.write(s.output_dir).items()}

    return _finetune(BertForQuestionAnswering, s, train_features, dev, f"squad{s.version}", finish, tokenizer,
                     f"{len(train_examples)} of the {len(all_train_examples)} training questions")


def predict_squad_file(s: PredictSquadSettings) -> dict[str, Any]:
    """Answer ``s.predict_file``: run_squad.py's prediction files, scored where the file has answers."""
    dataset = squad.load_squad(s.predict_file)
    examples = first(squad.squad_examples(dataset["data"], source=str(s.predict_file)), s.max_predict_samples)
    scored = any(e.answers or e.is_impossible for e in examples)  # gold answers given: the official scores
    if scored:
        _refuse_unanswerable_in_v1(s.version, "prediction", examples)
    model, tokenizer, precision = load_finetuned(BertForQuestionAnswering, s, "squad")
    features = squad.featurize_squad(examples, tokenizer, max_seq_length=s.max_seq_length, doc_stride=s.doc_stride,
                                     max_query_length=s.max_query_length)
    preds, _ = predict_squad(model, examples, features, pad_id=tokenizer.pad_token_id, version=s.version,
                             n_best_size=s.n_best_size, max_answer_length=s.max_answer_length,
                             null_threshold=s.null_threshold, batch_size=s.batch_size, bf16=precision.bf16,
                             device=precision.device)
    report: dict[str, Any] = {"task": f"squad{s.version}", "predict_file": str(s.predict_file),
                              "questions": len(examples),
                              "files": {k: str(v) for k, v in preds.write(s.output_dir).items()}}
    if scored:
        report["scores"] = official_scores(s.version, questions_of(dataset["data"], examples), preds, s.null_threshold)
    return prediction_report(s, precision, report)


# -- SWAG -------------------------------------------------------------------------------------------------------------


def predict_swag(model: nn.Module, features: Sequence[dict], *, pad_id: int, batch_size: int = EVAL_BATCH_SIZE,
                 bf16: bool = False, device: str = "cpu") -> np.ndarray:
    """(N, 4) ending scores."""
    return np.stack(predict(model, features, pad_id, batch_size=batch_size, bf16=bf16, device=device))


def swag_accuracy(examples: Sequence[swag.SwagExample], scores: np.ndarray) -> float | None:
    """The share of examples whose best-scored ending is the gold one; None when the file has no labels."""
    if any(e.label is None for e in examples):
        return None
    return float((scores.argmax(-1) == np.asarray([e.label for e in examples])).mean())


def write_swag_predictions(path: Path, examples: Sequence[swag.SwagExample], scores: np.ndarray) -> Path:
    """predictions.jsonl: per example its CSV line, video id, ending scores, predicted and gold ending. An ending
    scored -inf (switched off: probability 0, as a softmax gives it) is written null, since -Infinity is no JSON."""
    with atomic_write(path) as f:
        for ex, row in zip(examples, scores, strict=True):
            f.write(json_text({"line": ex.line, "video_id": ex.video_id, "scores": [float(x) for x in row],
                               "prediction": int(row.argmax()), "label": ex.label}) + "\n")
    return path


def finetune_swag(s: SwagSettings) -> dict[str, Any]:
    """Fine-tune on SWAG: accuracy on the predict file after every epoch (when labelled), and its
    ``predictions.jsonl``."""
    tokenizer, s = checkpoint_tokenizer(s)
    all_train = swag.read_swag(s.train_file)
    if any(e.label is None for e in all_train):
        raise BertkitError(f"{s.train_file} has no label column; train on a labelled file (train.csv)")
    train_examples = first(all_train, s.max_train_samples)
    all_eval = swag.read_swag(s.predict_file)
    eval_examples = first(all_eval, s.max_eval_samples)
    train_features = swag.featurize_swag(train_examples, tokenizer, s.max_seq_length)
    eval_features = swag.featurize_swag(eval_examples, tokenizer, s.max_seq_length)

    def scores_of(model: nn.Module) -> np.ndarray:
        return predict_swag(model, eval_features, pad_id=tokenizer.pad_token_id, batch_size=s.eval_batch_size,
                            bf16=s.bf16, device=process_device(s.device))

    # an unlabelled file is predicted at the end, never scored in the loop (asking to is refused: SwagSettings)
    labelled = all(e.label is not None for e in eval_examples)

    def dev(model: nn.Module) -> tuple[np.ndarray, dict[str, float]]:
        scores = scores_of(model)
        return scores, {"accuracy": swag_accuracy(eval_examples, scores)} if labelled else {}

    def finish(model: nn.Module, tokenizer: BertTokenizer, report: dict, scores: np.ndarray) -> dict[str, str]:
        report.update(train_examples=len(train_examples), eval_examples=len(eval_examples),
                      evaluated_on=_evaluated_on(f"{s.predict_file}: all {len(all_eval)} examples.", len(eval_examples),
                                                len(all_eval), "examples"),
                      accuracy=swag_accuracy(eval_examples, scores))
        return {"predictions": str(write_swag_predictions(s.output_dir / "predictions.jsonl", eval_examples, scores))}

    return _finetune(BertForMultipleChoice, s, train_features, dev, "swag", finish, tokenizer,
                     f"{len(train_examples)} of the {len(all_train)} training examples", evaluate=labelled)


def predict_swag_file(s: PredictSwagSettings) -> dict[str, Any]:
    """Score the endings of ``s.predict_file``: predictions.jsonl, and accuracy when it has labels."""
    model, tokenizer, precision = load_finetuned(BertForMultipleChoice, s, "swag")
    examples = first(swag.read_swag(s.predict_file), s.max_predict_samples)
    scores = predict_swag(model, swag.featurize_swag(examples, tokenizer, s.max_seq_length),
                          pad_id=tokenizer.pad_token_id, batch_size=s.batch_size, bf16=precision.bf16,
                          device=precision.device)
    path = write_swag_predictions(s.output_dir / "predictions.jsonl", examples, scores)
    return prediction_report(s, precision, {"task": "swag", "predict_file": str(s.predict_file), "examples": len(examples),
                                     "accuracy": swag_accuracy(examples, scores), "files": {"predictions": str(path)}})
