"""``bertkit demo``: the BERT recipe end to end on text every Python installation carries.

The corpus is real English text on every machine: the Python language reference topics and the docstrings
of ~70 standard-library modules. The demo prints a sentence-similarity table from the real pre-trained
checkpoint, learns a WordPiece vocabulary, makes masked-LM + next-sentence instances, pre-trains a small BERT
(held-out MLM/NSP accuracy as it rises), shows its fill-mask predictions, and fine-tunes it on which module
family (text / files / numbers) a docstring comes from, against the same network without pre-training: the
paper's point, in miniature. Every stage is a library call that also runs on your own files.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import logging
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertkit.tokenization.encoding import segment_ids

logger = logging.getLogger("bertkit")

# Pre-training steps and the seed of every stage in a direct call (the command passes its settings').
DEMO_STEPS = 2000
DEMO_SEED = 0

# Three families of standard-library modules; a docstring's family is the fine-tuning label.
FAMILIES: dict[str, tuple[str, ...]] = {
    "text": ("string", "re", "textwrap", "difflib", "unicodedata", "codecs", "html", "html.parser",
             "email.message", "email.utils", "csv", "json", "shlex", "gettext", "locale", "stringprep", "xml.dom.minidom"),
    "files": ("os", "os.path", "shutil", "pathlib", "glob", "fnmatch", "tempfile", "stat", "filecmp", "io",
              "zipfile", "tarfile", "gzip", "bz2", "lzma", "fileinput", "mmap"),
    "numbers": ("math", "cmath", "decimal", "fractions", "statistics", "random", "numbers", "operator",
                "array", "bisect", "heapq", "struct", "secrets", "colorsys", "itertools"),
}
EXTRA_MODULES = ("collections", "functools", "contextlib", "typing", "dataclasses", "enum", "abc", "argparse",
                 "logging", "threading", "queue", "subprocess", "socket", "asyncio", "unittest", "inspect",
                 "pickle", "copy", "pprint", "datetime", "calendar", "time", "sched", "weakref", "types")
SIMILARITY_SENTENCES = (
    "The for statement is used to iterate over the elements of a sequence.",
    "The while statement is used for repeated execution as long as an expression is true.",
    "Return the square root of x.",
    "Return the natural logarithm of x.",
    "Remove a file or directory.",
    "Delete the file at the given path.",
)
FILL_MASK = (
    "The [MASK] statement is used to iterate over the elements of a sequence.",
    "Return the square [MASK] of x.",
    "Raise an exception if the [MASK] does not exist.",
    "A class definition defines a class [MASK].",
)


# -------------------------------------------------------------------------------------------------
# The embedded corpus
# -------------------------------------------------------------------------------------------------

_HEADING_RULE = re.compile(r"^[*=\-~^\"]{3,}\s*$")


def _prose_paragraphs(text: str) -> list[str]:
    """Paragraphs of running text: wrapped lines joined; code blocks, headings and lists dropped."""
    out = []
    for block in re.split(r"\n\s*\n", text):
        lines = block.splitlines()
        if not lines or any(_HEADING_RULE.match(line) for line in lines):
            continue
        if lines[0].startswith((" ", "\t", ">>>", "*", "-", "+")) or "::=" in block:
            continue  # code, grammar productions, lists, doctest
        paragraph = " ".join(line.strip() for line in lines)
        if len(paragraph.split()) >= 6 and paragraph.rstrip("\"')").endswith((".", ":", "?", "!")):
            out.append(paragraph)
    return out


def _module_docs(name: str) -> list[tuple[str, str]]:
    """(qualified name, docstring) for a module and its public classes, functions and methods."""
    try:
        module = importlib.import_module(name)
    except ImportError:  # a module this Python build lacks (e.g. without lzma); the corpus just omits it
        logger.info("demo corpus: module %s is not available in this Python; skipped", name)
        return []
    docs = [(name, inspect.getdoc(module) or "")]
    for attr, obj in sorted(vars(module).items()):
        if attr.startswith("_") or getattr(obj, "__module__", name) not in (name, module.__name__):
            continue
        if inspect.isclass(obj) or inspect.isroutine(obj):
            docs.append((f"{name}.{attr}", inspect.getdoc(obj) or ""))
            if inspect.isclass(obj):
                for m_name, member in sorted(vars(obj).items()):
                    if not m_name.startswith("_") and inspect.isroutine(member):
                        docs.append((f"{name}.{attr}.{m_name}", inspect.getdoc(member) or ""))
    return [(q, d) for q, d in docs if d.strip()]


def build_corpus(out_dir: Path) -> dict[str, Any]:
    """Write train.txt / heldout.txt in google's format (a sentence per line, blank line between documents): the
    language-reference topics and one document per module, every 10th held out."""
    import pydoc_data.topics

    from bertkit.data.text import split_sentences
    from bertkit.outputs import atomic_write

    documents: list[tuple[str, list[str]]] = []
    for topic, text in sorted(pydoc_data.topics.topics.items()):
        documents.append((f"topic:{topic}", _prose_paragraphs(text)))
    for name in sorted({m for ms in FAMILIES.values() for m in ms} | set(EXTRA_MODULES)):
        documents.append((f"module:{name}", [p for _, d in _module_docs(name) for p in _prose_paragraphs(d)]))
    out_dir.mkdir(parents=True, exist_ok=True)
    counts = {"train": [0, 0], "heldout": [0, 0]}
    with atomic_write(out_dir / "train.txt") as tr, atomic_write(out_dir / "heldout.txt") as ho:
        kept = 0
        for _name, paragraphs in documents:
            sentences = [s for p in paragraphs for s in split_sentences(p)]
            if len(sentences) < 2:
                continue
            kept += 1
            split = "heldout" if kept % 10 == 0 else "train"
            (ho if split == "heldout" else tr).write("\n".join(sentences) + "\n\n")
            counts[split][0] += 1
            counts[split][1] += len(sentences)
    return {k: {"documents": v[0], "sentences": v[1]} for k, v in counts.items()}


def docstring_task() -> tuple[list[str], list[tuple[str, int]], list[tuple[str, int]]]:
    """(labels, train, dev): first paragraph of each public docstring -> module family."""
    labels = list(FAMILIES)
    train, dev = [], []
    for label, modules in FAMILIES.items():
        for module in modules:
            for qualname, doc in _module_docs(module)[1:]:
                paragraphs = _prose_paragraphs(doc)
                if not paragraphs:
                    continue
                text = paragraphs[0][:400]
                example = (text, labels.index(label))
                # a stable split by name: every fifth member (by hash) is a dev example
                (dev if int(hashlib.sha256(qualname.encode()).hexdigest(), 16) % 5 == 0 else train).append(example)
    return labels, train, dev


# -------------------------------------------------------------------------------------------------
# The stages
# -------------------------------------------------------------------------------------------------


def run_demo(model_dir: Path | None, out_dir: Path, *, pretrain_steps: int = DEMO_STEPS, vocab_size: int = 4000,
             seed: int = DEMO_SEED, progress: bool = True, say: Callable[[str], None] = print) -> dict[str, Any]:
    """Run every stage; returns (and writes to ``out_dir/demo.json``) what each stage measured."""
    from bertkit import pipeline
    from bertkit.dir_lock import placed_path
    from bertkit.outputs import atomic_write_json

    t_start = time.perf_counter()
    report: dict[str, Any] = {}
    out_dir.mkdir(parents=True, exist_ok=True)
    if model_dir is not None:
        say("== 1. A real pre-trained BERT (MiniLM-L6-H384): sentence similarity ==")
        emb = np.asarray(pipeline("sentence-embedding", model_dir, progress=False)(list(SIMILARITY_SENTENCES)))
        report["similarity"] = (emb @ emb.T).tolist()  # cosines: the embeddings are unit vectors
        for i, row in enumerate(report["similarity"]):
            say(f"  [{i}] " + " ".join(f"{v:5.2f}" for v in row) + f"   {SIMILARITY_SENTENCES[i][:60]}")
    say("\n== 2. Corpus: Python's own documentation (pydoc topics + standard-library docstrings) ==")
    report["corpus"] = build_corpus(out_dir / "corpus")
    say(f"  {report['corpus']}")
    tok, vocab_dir, vocab_len = _vocabulary_stage(out_dir, vocab_size, progress, say)
    _instances_stage(out_dir, tok, seed, progress, say)
    config, run_dir, curve = _pretraining_stage(out_dir, vocab_dir, vocab_len, pretrain_steps, seed, progress, say)
    report["pretraining_curve"] = curve
    say("\n== 6. Fill-mask with the new model ==")
    fill = pipeline("fill-mask", run_dir / "final", progress=False)
    report["fill_mask"] = [(text, [c["token_str"] for c in fill(text, top_k=3)]) for text in FILL_MASK]
    for text, top in report["fill_mask"]:
        say(f"  {text}\n      -> {top}")
    report["finetune"] = _finetuning_stage(out_dir, run_dir, config, tok, seed, progress, say)
    report["seconds"] = round(time.perf_counter() - t_start, 1)
    atomic_write_json(out_dir / "demo.json", report)
    # out_dir is the command's staging directory until the run is moved into place: name where it will be
    say(f"\nDone in {report['seconds']} s. Everything is in {placed_path(out_dir)} (demo.json, pretrain/metrics.png).")
    return report


def _vocabulary_stage(out_dir: Path, vocab_size: int, progress: bool, say: Callable[[str], None]) -> tuple[Any, Path, int]:
    """(the tokenizer, its directory, its vocabulary size) learnt from the corpus's training split."""
    from bertkit import BertTokenizer
    from bertkit.tokenization.trainer import train_wordpiece_vocab

    say(f"\n== 3. Learning a {vocab_size}-entry WordPiece vocabulary ==")
    vocab = train_wordpiece_vocab([out_dir / "corpus" / "train.txt"], vocab_size=vocab_size, min_frequency=2,
                                  lowercase=True, num_workers=1, progress=progress)
    vocab_dir = out_dir / "vocab"
    tok = BertTokenizer(vocab)
    tok.save_pretrained(vocab_dir)
    sample = "The for statement iterates over the elements of a sequence."
    say(f"  {len(vocab)} entries; '{sample}' -> {tok.tokenize(sample)}")
    return tok, vocab_dir, len(vocab)


def _instances_stage(out_dir: Path, tok: Any, seed: int, progress: bool, say: Callable[[str], None]) -> None:
    """Instances of the train and held-out splits, in out_dir/instances-train and instances-heldout."""
    from bertkit.data.pretraining import create_pretraining_data

    say("\n== 4. Pre-training instances: masked LM (15%: 80/10/10) + next sentence (50% random) ==")
    for split, dupe in (("train", 5), ("heldout", 1)):
        data = create_pretraining_data(
            [out_dir / "corpus" / f"{split}.txt"], tok, out_dir / f"instances-{split}", max_seq_length=64,
            max_predictions_per_seq=10, dupe_factor=dupe, input_format="sentences", seed=seed + 1,
            num_workers=1, progress=progress, overwrite=True)
        say(f"  {split}: {data['counts']['instances']} instances from {data['counts']['documents']} documents")


def _pretraining_stage(out_dir: Path, vocab_dir: Path, vocab_len: int, pretrain_steps: int, seed: int,
                       progress: bool, say: Callable[[str], None]) -> tuple[Any, Path, list[dict[str, Any]]]:
    """(the model's config, the run's directory, the held-out curve) of a small BERT pre-trained from scratch."""
    from bertkit import BertConfig
    from bertkit.runs import output_dir
    from bertkit.settings import PretrainSettings
    from bertkit.training.pretrain import pretrain

    say(f"\n== 5. Pre-training a 2-layer, 128-wide BERT from scratch for {pretrain_steps} steps ==")
    config = BertConfig.preset("tiny", vocab_size=vocab_len, max_position_embeddings=64)
    run_dir = out_dir / "pretrain"
    # An earlier demo's pre-training run is replaced (its recorded files only); anything else there is refused.
    with output_dir(run_dir, "demo pretrain", {"steps": pretrain_steps, "seed": seed}, overwrite=True) as claim:
        result = pretrain(PretrainSettings(
            data=out_dir / "instances-train", vocab=vocab_dir, config_name=config, max_steps=pretrain_steps,
            batch_size=32, eval_data=out_dir / "instances-heldout", eval_steps=max(1, pretrain_steps // 6),
            eval_instances=1000, output_dir=claim.path, learning_rate=1e-3, warmup_ratio=0.05, seed=seed,
            logging_steps=50, progress=progress))
    say("  step   held-out MLM acc   NSP acc")
    curve = [r for r in result.history if r["split"] == "eval"]
    for r in curve:
        say(f"  {r['step']:5d}   {r['mlm_acc']:15.3f}   {r['nsp_acc']:7.3f}")
    say(f"  curves: {run_dir / 'metrics.png'}; model: {run_dir / 'final'}")
    return config, run_dir, [{k: r[k] for k in ("step", "mlm_acc", "nsp_acc", "mlm_loss")} for r in curve]


def _finetuning_stage(out_dir: Path, run_dir: Path, config: Any, tok: Any, seed: int, progress: bool,
                      say: Callable[[str], None]) -> dict[str, Any]:
    """Dev accuracy of the docstring task, fine-tuned from the pre-trained model and from random weights."""
    from bertkit import BertForSequenceClassification
    from bertkit.data.collate import collate as pad_batch
    from bertkit.inference.predict import predict
    from bertkit.settings import TrainingSettings
    from bertkit.training.finetune_run import remove_checkpoints, run_finetuning

    say("\n== 7. Fine-tuning: which module family (text / files / numbers) does a docstring describe? ==")
    labels, train_ex, dev_ex = docstring_task()
    train_f, dev_f = _featurize(tok, train_ex), _featurize(tok, dev_ex)

    def collate(batch):
        return pad_batch(batch, tok.pad_token_id)

    def accuracy(model):
        logits = predict(model, dev_f, tok.pad_token_id, batch_size=128)
        return {"accuracy": sum(int(lg.argmax() == f["labels"]) for lg, f in zip(logits, dev_f)) / len(dev_f)}

    majority = max(sum(1 for _, y in dev_ex if y == k) for k in range(len(labels))) / len(dev_ex)
    finetune = {"train_examples": len(train_f), "dev_examples": len(dev_f), "majority_baseline": majority}
    for name, init in (("pre-trained", run_dir / "final"), ("no pre-training", None)):
        torch.manual_seed(seed)
        if init is None:
            model = BertForSequenceClassification(config.with_labels(labels))
        else:
            model = BertForSequenceClassification.from_pretrained(init, id2label=dict(enumerate(labels)))
        run = TrainingSettings(output_dir=out_dir / f"finetune-{name.replace(' ', '-')}", learning_rate=5e-4,
                               seed=seed, num_train_epochs=5, batch_size=32, progress=progress)
        fit = run_finetuning(model, train_f, collate, run, accuracy, {"demo": name})
        remove_checkpoints(run)
        finetune[name] = fit.result.last_eval["accuracy"]
        # Pre-training shows most in how fast fine-tuning learns: both may end level on a task this small.
        finetune[f"{name} by epoch"] = [round(r["accuracy"], 4) for r in fit.per_epoch]
    say(f"  {len(train_f)} train / {len(dev_f)} dev docstrings; majority class {majority:.3f}")
    say("  dev accuracy after each epoch:")
    for name in ("pre-trained", "no pre-training"):
        say(f"    {name:>16}: " + "  ".join(f"{a:.3f}" for a in finetune[f"{name} by epoch"]))
    return finetune


def _featurize(tok: Any, examples: list[tuple[str, int]]) -> list[dict[str, Any]]:
    enc = tok([t for t, _ in examples], max_length=64, truncation=True)
    return [{"input_ids": i, "token_type_ids": s, "attention_mask": m, "labels": y}
            for i, s, m, (_, y) in zip(enc["input_ids"], segment_ids(enc), enc["attention_mask"], examples)]
