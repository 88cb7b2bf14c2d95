"""sentence-transformers and bertkit.sentence on a CUDA GPU: the same scripts, one process, rounds interleaved.

Four rows, each a small script run once with ``sentence_transformers`` and once with ``bertkit.sentence``; the
only thing that differs between the two runs is the import (``imports``):
- ``embed_train``: MultipleNegativesRankingLoss on SQuAD v1.1 dev (question, paragraph) pairs (every paragraph's
  first question, then every paragraph's second, ...), batch 64 drawn by the no-duplicates sampler,
  max_seq_length 256, bf16, one epoch, learning rate 5e-5 with 10% warmup, no saving, no evaluation, no progress
  bar, each library's own data-loader defaults; pairs/s of ``trainer.train()``.
- ``rerank_train``: ``CrossEncoder(model, num_labels=1)`` and BinaryCrossEntropyLoss on rows (question, its
  paragraph, 1.0) and (question, a paragraph of another article, 0.0), batch 32, bf16, one epoch; rows/s.
- ``encode``: ``model.encode`` of 2,000 SQuAD paragraphs, batch 128, max_seq_length 256, fp32 (no autocast,
  TF32 off); texts/s after a one-batch warm-up.
- ``ce_predict``: ``CrossEncoder.predict`` of 2,000 (question, paragraph) pairs, batch 64, fp32; pairs/s after a
  one-batch warm-up.
- ``sparse_train``: a SPLADE ``SparseEncoder`` (fill-mask Transformer + SpladePooling max/relu over the masked-LM
  head) trained with SpladeLoss over SparseMultipleNegativesRankingLoss on the embedder's pairs, batch 32,
  max_seq_length 256, bf16, one epoch; pairs/s.
- ``sparse_encode``: its ``encode_document`` of 2,000 paragraphs, batch 32, fp32 (sparse tensors); texts/s.
Defaults: 8,192 training pairs and 16,384 reranker rows (``--scale`` multiplies both), 2 rounds. The model is
BERT-BASE's shape (L=12, H=768, A=12) on the uncased 30,522-token vocabulary (``--vocab``) with seeded random
weights (speed does not depend on their values), saved once by transformers: the embedder directory holds a
``BertModel`` (both libraries build mean pooling over a plain BERT directory), the cross-encoder directory the
same encoder with a seeded 1-label classifier (so both libraries start from the same weights and the same
scores: a head each library initialised itself would differ). Both directories hold the tokenizer
transformers builds from the vocabulary.

Each row prints one JSON line once its rounds are done: both libraries' throughput in the last (warm) round and
in every round, the ratio bertkit / sentence-transformers, each library's peak GPU memory over its runs of the
row (allocated and reserved, the peak counters reset before each run), the training loss (the epoch's mean and
the last logged) or the largest difference of the outputs between the libraries, and ``tokenize_s``: each
library's own tokenization of the row's texts alone, in the row's batches, on the host (an upper bound of what
the host adds to the run where nothing overlaps it). ``--profile ROWS`` (comma-separated) then runs bertkit's
script of each under torch.profiler for a few steps (CPU and CUDA activity) and prints one more JSON line each:
the top CUDA kernels by total time, the top CPU operators by self time, the aten operators dispatched a step (what
the host launches: on a CPU, with ``--smoke``, the measure of per-step host work), the GPU-busy fraction (summed
kernel time over the profiled wall time), the synchronisations and copies; with ``OUT`` set it writes the chrome
trace there, gzipped. A row that fails prints a JSON line with its error, and the next row runs.

    python bench/bench_gpu_sentence.py --data ../shared/data --vocab models/minilm      # about 4 minutes, H100
    python bench/bench_gpu_sentence.py --scale 0.25 --rows embed_train,encode --profile encode
    python bench/bench_gpu_sentence.py --smoke --device cpu                             # 2 layers, 64 rows each

A device machine receives the repository alone (not ../shared/data, not the ignored models/):
``bench/gpu_check.sh prepare`` copies what this reads into ``.gpu/`` with the wheels ``datasets`` needs there, and
``bench/gpu_check.sh run sentence`` runs it on the device (with every other GPU row: ``run`` alone).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import gzip
import importlib
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from contextlib import nullcontext
from pathlib import Path
from types import SimpleNamespace

import torch
import transformers

REPO = Path(__file__).resolve().parents[1]
LIBS = ("sentence_transformers", "bertkit")
ROWS = ("embed_train", "rerank_train", "encode", "ce_predict", "sparse_train", "sparse_encode")
UNITS = {"embed_train": "pairs/s", "rerank_train": "rows/s", "encode": "texts/s", "ce_predict": "pairs/s",
         "sparse_train": "pairs/s", "sparse_encode": "texts/s"}
BASE = {"num_hidden_layers": 12, "hidden_size": 768, "num_attention_heads": 12, "intermediate_size": 3072}
SMOKE = {"num_hidden_layers": 2, "hidden_size": 128, "num_attention_heads": 2, "intermediate_size": 512}


def imports(lib: str) -> SimpleNamespace:
    """The one place the two libraries differ: what a script imports."""
    if lib == "sentence_transformers":
        import sentence_transformers as S
        from sentence_transformers.cross_encoder import losses as ce_losses
        from sentence_transformers.sentence_transformer import losses
        from sentence_transformers.sentence_transformer.training_args import BatchSamplers
        from sentence_transformers.sparse_encoder import losses as sparse_losses
    else:
        S = importlib.import_module("bertkit.sentence")
        from bertkit.sentence import losses
        from bertkit.sentence.cross_encoder import losses as ce_losses
        from bertkit.sentence.sparse_encoder import losses as sparse_losses
        from bertkit.sentence.training_args import BatchSamplers
    return SimpleNamespace(S=S, losses=losses, ce_losses=ce_losses, sparse_losses=sparse_losses,
                           BatchSamplers=BatchSamplers, name=lib)


# -- data and checkpoints ------------------------------------------------------------------------------------------

def squad(path: Path) -> tuple[list[tuple[str, str, int]], list[str]]:
    """(question, paragraph, article index) for every question, every paragraph's first question, then every
    paragraph's second, ...: a prefix spreads over the articles. And the distinct paragraphs in file order."""
    if not path.is_file():
        raise FileNotFoundError(f"{path} is absent: give --data a folder holding squad/dev-v1.1.json")
    articles = json.loads(path.read_text(encoding="utf-8"))["data"]
    paragraphs = [(p, a) for a, art in enumerate(articles) for p in art["paragraphs"]]
    deepest = max(len(p["qas"]) for p, _ in paragraphs)
    pairs = [(p["qas"][j]["question"], p["context"], a) for j in range(deepest) for p, a in paragraphs
             if j < len(p["qas"])]
    return pairs, [p["context"] for p, _ in paragraphs]


def workloads(path: Path, n_pairs: int, n_rerank: int, n_texts: int, n_predict: int) -> dict[str, list]:
    pairs, paragraphs = squad(path)
    if max(n_pairs, n_rerank // 2, n_predict) > len(pairs) or n_texts > len(paragraphs):
        raise ValueError(f"SQuAD dev has {len(pairs)} questions and {len(paragraphs)} paragraphs: asked for "
                         f"{n_pairs} pairs, {n_rerank // 2} reranker questions, {n_texts} texts, {n_predict} pairs")
    by_article: dict[int, list[str]] = {}
    for _, text, a in pairs:
        by_article.setdefault(a, [])
        if text not in by_article[a]:
            by_article[a].append(text)
    n_articles = len(by_article)
    rerank = []
    for i, (q, text, a) in enumerate(pairs[:n_rerank // 2]):
        other = by_article[(a + n_articles // 2) % n_articles]  # an article far from this one in the file
        rerank += [{"query": q, "text": text, "label": 1.0}, {"query": q, "text": other[i % len(other)], "label": 0.0}]
    return {"embed_train": [{"question": q, "paragraph": t} for q, t, _ in pairs[:n_pairs]],
            "rerank_train": rerank, "encode": paragraphs[:n_texts],
            "ce_predict": [(q, t) for q, t, _ in pairs[:n_predict]],
            "sparse_train": [{"question": q, "paragraph": t} for q, t, _ in pairs[:n_pairs // 2]],
            "sparse_encode": paragraphs[:n_texts]}


SAMPLE_PARAGRAPH = ("Super Bowl 50 was an American football game to determine the champion of the National Football "
                    "League (NFL) for the 2015 season. The American Football Conference (AFC) champion Denver Broncos "
                    "defeated the National Football Conference (NFC) champion Carolina Panthers 24-10.")


def checkpoints(tmp: Path, vocab: Path, shape: dict, seed: int) -> tuple[Path, Path, Path]:
    """The embedder directory (a BertModel), the cross-encoder directory (the same encoder and a seeded 1-label
    classifier) and the masked-LM directory (the same encoder and a seeded masked-LM head whose bias is set so that
    a paragraph activates about 1% of the word pieces, some hundreds, as a trained SPLADE model's do), each with
    the tokenizer transformers builds from ``vocab/vocab.txt``."""
    if not (vocab / "vocab.txt").is_file():
        raise FileNotFoundError(f"{vocab} holds no vocab.txt: give --vocab a directory with the uncased vocabulary")
    words = (vocab / "vocab.txt").read_text(encoding="utf-8").splitlines()
    tok = transformers.BertTokenizer(vocab={w: i for i, w in enumerate(words)}, do_lower_case=True,
                                     model_max_length=512)
    ids = tok("Which NFL team won Super Bowl 50?")["input_ids"]
    if tok.unk_token_id in ids or ids[0] != words.index("[CLS]"):
        raise RuntimeError(f"the tokenizer built from {vocab / 'vocab.txt'} gives {ids}: not the uncased vocabulary")
    config = transformers.BertConfig(vocab_size=len(words), max_position_embeddings=512, **shape)
    torch.manual_seed(seed)
    encoder = transformers.BertModel(config)
    embedder, ce = tmp / "bert", tmp / "cross-encoder"
    encoder.save_pretrained(embedder)
    torch.manual_seed(seed + 1)
    head = transformers.BertForSequenceClassification(transformers.BertConfig(
        vocab_size=len(words), max_position_embeddings=512, num_labels=1, **shape))
    head.bert.load_state_dict(encoder.state_dict())
    head.save_pretrained(ce)
    torch.manual_seed(seed + 2)
    mlm_dir = tmp / "masked-lm"
    mlm = transformers.BertForMaskedLM(config)
    mlm.bert.load_state_dict(encoder.state_dict(), strict=False)  # the masked-LM model has no pooler
    with torch.no_grad():  # the bias at the 99th percentile of a paragraph's largest logit per word piece
        ids = tok(SAMPLE_PARAGRAPH, return_tensors="pt")
        largest = mlm.eval()(**ids).logits[0].max(0).values  # (V,)
        mlm.cls.predictions.bias.sub_(torch.quantile(largest, 0.99))
    mlm.save_pretrained(mlm_dir)
    for d in (embedder, ce, mlm_dir):
        tok.save_pretrained(d)
        shutil.copyfile(vocab / "vocab.txt", d / "vocab.txt")
    return embedder, ce, mlm_dir


# -- the scripts ---------------------------------------------------------------------------------------------------

def train_args(cls, out: Path, batch: int, opts: SimpleNamespace, **extra):
    return cls(output_dir=str(out), per_device_train_batch_size=batch, num_train_epochs=1, learning_rate=5e-5,
               warmup_steps=0.1, logging_steps=10, save_strategy="no", eval_strategy="no", report_to="none",
               seed=opts.seed, disable_tqdm=True, bf16=opts.bf16, **({"use_cpu": True} if opts.device == "cpu" else {}),
               **({"torch_compile": True} if opts.compile and cls.__module__.split(".")[0] in opts.compile else {}),
               **extra)


def embed_train(L: SimpleNamespace, model_dir: Path, data: list[dict], opts: SimpleNamespace, callbacks=()) -> dict:
    from datasets import Dataset

    model = L.S.SentenceTransformer(str(model_dir), device=opts.device)
    model.max_seq_length = 256
    args = train_args(L.S.SentenceTransformerTrainingArguments, opts.tmp / "embed", opts.batch["embed_train"], opts,
                      batch_sampler=L.BatchSamplers.NO_DUPLICATES)
    trainer = L.S.SentenceTransformerTrainer(model=model, args=args, train_dataset=Dataset.from_list(data),
                                             loss=L.losses.MultipleNegativesRankingLoss(model),
                                             callbacks=list(callbacks))
    start = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, **losses_of(trainer, result), "model": model}


def rerank_train(L: SimpleNamespace, model_dir: Path, data: list[dict], opts: SimpleNamespace, callbacks=()) -> dict:
    from datasets import Dataset

    model = L.S.CrossEncoder(str(model_dir), num_labels=1, device=opts.device)
    args = train_args(L.S.CrossEncoderTrainingArguments, opts.tmp / "rerank", opts.batch["rerank_train"], opts)
    trainer = L.S.CrossEncoderTrainer(model=model, args=args, train_dataset=Dataset.from_list(data),
                                      loss=L.ce_losses.BinaryCrossEntropyLoss(model), callbacks=list(callbacks))
    start = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, **losses_of(trainer, result), "model": model}


def encode(L: SimpleNamespace, model_dir: Path, texts: list[str], opts: SimpleNamespace, profiler=None) -> dict:
    model = L.S.SentenceTransformer(str(model_dir), device=opts.device)
    model.max_seq_length = 256
    batch = opts.batch["encode"]
    model.encode(texts[:batch], batch_size=batch, show_progress_bar=False)  # warm-up
    with profiler if profiler is not None else nullcontext():
        sync(opts)
        start = time.perf_counter()
        out = model.encode(texts, batch_size=batch, show_progress_bar=False)
        sync(opts)
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "output": torch.as_tensor(out), "model": model}


def ce_predict(L: SimpleNamespace, model_dir: Path, pairs: list[tuple], opts: SimpleNamespace, profiler=None) -> dict:
    model = L.S.CrossEncoder(str(model_dir), num_labels=1, device=opts.device)
    batch = opts.batch["ce_predict"]
    model.predict(pairs[:batch], batch_size=batch, show_progress_bar=False)  # warm-up
    with profiler if profiler is not None else nullcontext():
        sync(opts)
        start = time.perf_counter()
        out = model.predict(pairs, batch_size=batch, show_progress_bar=False)
        sync(opts)
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "output": torch.as_tensor(out), "model": model}


def sparse_train(L: SimpleNamespace, model_dir: Path, data: list[dict], opts: SimpleNamespace, callbacks=()) -> dict:
    from datasets import Dataset

    model = L.S.SparseEncoder(str(model_dir), device=opts.device)
    model.max_seq_length = 256
    args = train_args(L.S.SparseEncoderTrainingArguments, opts.tmp / "sparse", opts.batch["sparse_train"], opts)
    loss = L.sparse_losses.SpladeLoss(model, loss=L.sparse_losses.SparseMultipleNegativesRankingLoss(model),
                                      document_regularizer_weight=3e-5, query_regularizer_weight=5e-5)
    trainer = L.S.SparseEncoderTrainer(model=model, args=args, train_dataset=Dataset.from_list(data), loss=loss,
                                       callbacks=list(callbacks))
    start = time.perf_counter()
    result = trainer.train()
    seconds = time.perf_counter() - start
    return {"seconds": seconds, **losses_of(trainer, result), "model": model}


def sparse_encode(L: SimpleNamespace, model_dir: Path, texts: list[str], opts: SimpleNamespace, profiler=None) -> dict:
    model = L.S.SparseEncoder(str(model_dir), device=opts.device)
    model.max_seq_length = 256
    batch = opts.batch["sparse_encode"]
    model.encode_document(texts[:batch], batch_size=batch)  # warm-up
    with profiler if profiler is not None else nullcontext():
        sync(opts)
        start = time.perf_counter()
        out = model.encode_document(texts, batch_size=batch)
        sync(opts)
        seconds = time.perf_counter() - start
    return {"seconds": seconds, "output": out.coalesce().cpu(), "model": model}


SCRIPTS = {"embed_train": embed_train, "rerank_train": rerank_train, "encode": encode, "ce_predict": ce_predict,
           "sparse_train": sparse_train, "sparse_encode": sparse_encode}


def sync(opts: SimpleNamespace) -> None:
    if opts.device == "cuda":
        torch.cuda.synchronize()


def losses_of(trainer, result) -> dict:
    logged = [r["loss"] for r in trainer.state.log_history if "loss" in r]
    return {"steps": int(result.global_step), "loss_mean": round(float(result.training_loss), 5),
            "loss_last_logged": round(float(logged[-1]), 5) if logged else None}


def tokenize_seconds(model, row: str, data: list, batch: int) -> float:
    """The library's tokenization of the row's texts alone, in the row's batches, with the model the run used:
    ``preprocess`` where the model has it (sentence-transformers; bertkit's CrossEncoder), else ``tokenize``."""
    if row in ("embed_train", "sparse_train"):
        batches = [[d[col] for d in data[i:i + batch]] for col in ("question", "paragraph")
                   for i in range(0, len(data), batch)]
    else:
        rows = [(d["query"], d["text"]) for d in data] if row == "rerank_train" else data
        batches = [rows[i:i + batch] for i in range(0, len(rows), batch)]
    fn = getattr(model, "preprocess", None) or model.tokenize
    fn(batches[0])
    start = time.perf_counter()
    for b in batches:
        fn(b)
    return round(time.perf_counter() - start, 3)


# -- running and measuring -----------------------------------------------------------------------------------------

def fresh(opts: SimpleNamespace) -> None:
    gc.collect()
    torch.backends.cuda.matmul.allow_tf32 = False  # torch's default: fp32 rows are exact fp32 products
    if opts.device == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def run_row(row: str, model_dir: Path, data: list, opts: SimpleNamespace, meta: dict) -> dict:
    n = len(data)
    runs: dict[str, list[dict]] = {lib: [] for lib in LIBS}
    memory: dict[str, dict[str, float]] = {lib: {"allocated": 0.0, "reserved": 0.0, "held": 0.0} for lib in LIBS}
    outputs: dict[str, torch.Tensor] = {}
    for _ in range(opts.rounds):
        for lib in LIBS:
            fresh(opts)
            torch.manual_seed(opts.seed)
            held = torch.cuda.memory_allocated() / 2**30 if opts.device == "cuda" else 0.0
            res = SCRIPTS[row](imports(lib), model_dir, data, opts)
            model = res.pop("model")
            if opts.host_split and len(runs[lib]) == opts.rounds - 1:  # the last round, after its timing
                res["tokenize_s"] = tokenize_seconds(model, row, data, opts.batch[row])
            del model
            if "output" in res:
                out = res.pop("output")
                outputs[lib] = out if out.is_sparse else out.float().cpu()
            if opts.device == "cuda":
                memory[lib]["allocated"] = max(memory[lib]["allocated"], torch.cuda.max_memory_allocated() / 2**30)
                memory[lib]["reserved"] = max(memory[lib]["reserved"], torch.cuda.max_memory_reserved() / 2**30)
                memory[lib]["held"] = max(memory[lib]["held"], held)  # left by earlier runs: 0 unless one leaks
            res["tf32_after"] = torch.backends.cuda.matmul.allow_tf32
            runs[lib].append(res)
            fresh(opts)
    warm = {lib: n / runs[lib][-1]["seconds"] for lib in LIBS}
    st, bk = LIBS
    record = {"bench": "gpu_sentence", "row": row, "unit": UNITS[row], "n": n, "batch": opts.batch[row],
              "precision": "bf16" if row.endswith("_train") and opts.bf16 else "fp32",
              **{f"{lib}_per_s": round(warm[lib], 1) for lib in LIBS}, "ratio": round(warm[bk] / warm[st], 3),
              **{f"{lib}_rounds_per_s": [round(n / r["seconds"], 1) for r in runs[lib]] for lib in LIBS}}
    if opts.device == "cuda":
        for lib in LIBS:
            record[f"{lib}_peak_allocated_gib"] = round(memory[lib]["allocated"], 3)
            record[f"{lib}_peak_reserved_gib"] = round(memory[lib]["reserved"], 3)
            record[f"{lib}_held_before_gib"] = round(memory[lib]["held"], 3)
        record["memory_ratio"] = round(memory[bk]["allocated"] / memory[st]["allocated"], 3)
    if row.endswith("_train"):
        for lib in LIBS:
            last = runs[lib][-1]
            record[f"{lib}_steps"] = last["steps"]
            record[f"{lib}_loss_mean"] = last["loss_mean"]
            record[f"{lib}_loss_last_logged"] = last["loss_last_logged"]
    elif outputs[st].is_sparse:  # a vector's word pieces must be the same ones, their weights close
        same = torch.equal(outputs[st].indices(), outputs[bk].indices())
        record["same_indices"] = same
        record["max_abs_diff"] = float((outputs[st].values() - outputs[bk].values()).abs().amax(0, keepdim=True).sum()) \
            if same else None
        record["active_dims"] = round(outputs[bk].values().numel() / outputs[bk].shape[0], 1)
    else:
        record["max_abs_diff"] = float((outputs[st] - outputs[bk]).abs().max())
    if any(r["tf32_after"] for lib in LIBS for r in runs[lib]):
        record["tf32_left_on_by"] = [lib for lib in LIBS if any(r["tf32_after"] for r in runs[lib])]
    if opts.host_split:
        record["tokenize_s"] = {lib: runs[lib][-1]["tokenize_s"] for lib in LIBS}
        record["tokenize_share_of_run"] = {lib: round(runs[lib][-1]["tokenize_s"] / runs[lib][-1]["seconds"], 3)
                                           for lib in LIBS}
    record.update(meta)
    return record


def device_time(event) -> float:
    """Microseconds on the device of a profiler row (torch < 2.4 names it ``self_cuda_time_total``)."""
    value = getattr(event, "self_device_time_total", None)
    return float(value if value is not None else getattr(event, "self_cuda_time_total", 0))


# -- the profile ---------------------------------------------------------------------------------------------------

def profile(row: str, model_dir: Path, data: list, opts: SimpleNamespace, lib: str = "bertkit") -> dict:
    """``lib``'s script of ``row`` under torch.profiler: training rows for ``--profile-steps`` steps after 2
    warm-up steps; encode and predict for ``--profile-steps`` batches after a one-batch warm-up."""
    from torch.profiler import ProfilerActivity, schedule
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if opts.device == "cuda" else [])
    active, warm = opts.profile_steps, 2
    batch = opts.batch[row]
    L = imports(lib)
    fresh(opts)
    torch.manual_seed(opts.seed)
    if row.endswith("_train"):
        if lib == "bertkit":
            from bertkit.training.callbacks import TrainerCallback
        else:
            from transformers import TrainerCallback

        marks: list[float] = []

        class Step(TrainerCallback):
            def on_step_end(self, args, state, control, **kwargs):
                marks.append(time.perf_counter())
                prof.step()

        data = data[:batch * (warm + active + 1)]
        prof = torch_profile(activities=activities, schedule=schedule(wait=0, warmup=warm, active=active, repeat=1))
        with prof:
            SCRIPTS[row](L, model_dir, data, opts, callbacks=[Step()])
        recorded = min(active, len(marks) - warm)  # fewer where the epoch ended first
        wall = marks[warm + recorded - 1] - marks[warm - 1] if recorded > 0 else None
    else:
        data = data[:batch * active]
        recorded = -(-len(data) // batch)
        prof = torch_profile(activities=activities)
        wall = SCRIPTS[row](L, model_dir, data, opts, profiler=prof)["seconds"]
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    cpu_ops = sorted((e for e in events if e.device_type == torch.autograd.DeviceType.CPU),
                     key=lambda e: e.self_cpu_time_total, reverse=True)
    kernel_source = "kernels"
    if not kernels and opts.device == "cuda":  # no kernel rows: the device time its launching operators record
        kernels, kernel_source = [e for e in cpu_ops if device_time(e) > 0], "operators' self device time"
    kernel_us = sum(device_time(e) for e in kernels)
    calls = {name: sum(e.count for e in events if e.key.startswith(name))
             for name in ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy",
                          "cudaLaunchKernel", "aten::item", "aten::_local_scalar_dense")}
    record = {"bench": "gpu_sentence_profile", "row": row, "library": lib, "device": opts.device_name,
              "profiled": f"{recorded} {'steps' if row.endswith('_train') else 'batches'} of {batch}",
              "wall_ms": round(wall * 1e3, 1) if wall else None, "kernel_ms": round(kernel_us / 1e3, 1),
              "kernel_source": kernel_source,
              "gpu_busy": round(kernel_us / 1e6 / wall, 3) if wall and kernels else None, "calls": calls,
              "top_kernels_ms": {e.key[:90]: [round(device_time(e) / 1e3, 2), e.count] for e in
                                 sorted(kernels, key=device_time, reverse=True)[:15]},
              "top_cpu_self_ms": {e.key[:90]: [round(e.self_cpu_time_total / 1e3, 2), e.count] for e in cpu_ops[:15]},
              "cpu_self_total_ms": round(sum(e.self_cpu_time_total for e in cpu_ops) / 1e3, 1),
              # aten operators the host dispatches a step or batch, views included: the launch count's proxy on a CPU
              "aten_ops_per_step": round(sum(e.count for e in cpu_ops if e.key.startswith("aten::"))
                                         / max(recorded, 1), 1)}
    out = os.environ.get("OUT")
    if out:
        trace = Path(opts.tmp) / f"trace_{row}_{lib}.json"
        prof.export_chrome_trace(str(trace))
        target = Path(out) / f"trace_{row}_{lib}.json.gz"
        with open(trace, "rb") as src, gzip.open(target, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        if target.stat().st_size > 15 * 2**20:
            target.unlink()
            record["trace"] = f"not kept: over 15 MiB gzipped; profile fewer steps (--profile-steps {active})"
        else:
            record["trace"] = str(target)
    fresh(opts)
    return record


def main(argv: list[str] | None = None) -> list[dict]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data",
                   help="a folder holding squad/dev-v1.1.json")
    p.add_argument("--vocab", type=Path, default=REPO / "models" / "minilm", help="a directory with vocab.txt")
    p.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    p.add_argument("--rows", default=",".join(ROWS), help=f"comma-separated, of {', '.join(ROWS)}")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--scale", type=float, default=1.0, help="multiplies the training rows' sizes (8,192 / 16,384)")
    p.add_argument("--smoke", action="store_true", help="a 2-layer model, 64 examples a row, smaller batches")
    p.add_argument("--no-bf16", action="store_true", help="train in fp32")
    p.add_argument("--no-host-split", action="store_true", help="skip the tokenize_s measurement")
    p.add_argument("--profile", default=None, help="comma-separated rows: also profile bertkit's script of each")
    p.add_argument("--profile-steps", type=int, default=5)
    p.add_argument("--profile-libs", default="bertkit", help="comma-separated: whose scripts --profile runs "
                   "(bertkit, sentence_transformers)")
    p.add_argument("--compile", nargs="?", const=",".join(LIBS), default="",
                   help="torch_compile=True in the training arguments of these libraries (comma-separated; "
                   "alone: both)")
    p.add_argument("--sdpa", default=None, help="comma-separated SDPA backends both libraries may use "
                   "(flash, efficient, cudnn, math; default: PyTorch's choice)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--seed", type=int, default=42)
    args = p.parse_args(argv)
    rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    profiled = [r.strip() for r in (args.profile or "").split(",") if r.strip()]
    unknown = [r for r in rows + profiled if r not in ROWS]
    if unknown:
        raise ValueError(f"--rows / --profile {unknown} unknown: give some of {', '.join(ROWS)}")
    if args.device == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda but torch sees no CUDA device: run with --device cpu (and --smoke)")
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.smoke:
        sizes, shape = (64, 64, 64, 64), SMOKE
        batch = {"embed_train": 16, "rerank_train": 16, "encode": 32, "ce_predict": 16, "sparse_train": 8,
                 "sparse_encode": 16}
    else:
        sizes = (round(8192 * args.scale), 2 * round(8192 * args.scale), 2000, 2000)
        shape, batch = BASE, {"embed_train": 64, "rerank_train": 32, "encode": 128, "ce_predict": 64,
                              "sparse_train": 32, "sparse_encode": 32}
    data = workloads(args.data / "squad" / "dev-v1.1.json", *sizes)
    device_name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    import sentence_transformers

    transformers.logging.set_verbosity_error()  # no progress bars for loading and saving weights
    transformers.logging.disable_progress_bar()
    if args.sdpa:  # a process-wide switch: both libraries' runs see the same backends
        allowed = set(args.sdpa.split(","))
        unknown_backends = allowed - {"flash", "efficient", "cudnn", "math"}
        if unknown_backends:
            raise ValueError(f"--sdpa {sorted(unknown_backends)} unknown: give some of flash, efficient, cudnn, math")
        torch.backends.cuda.enable_flash_sdp("flash" in allowed)
        torch.backends.cuda.enable_mem_efficient_sdp("efficient" in allowed)
        torch.backends.cuda.enable_cudnn_sdp("cudnn" in allowed)
        torch.backends.cuda.enable_math_sdp("math" in allowed)
    meta = {"device": device_name, "sdpa": args.sdpa or "default", "compile": args.compile, "layers": shape["num_hidden_layers"], "hidden": shape["hidden_size"],
            "rounds": args.rounds, "torch": torch.__version__, "transformers": transformers.__version__,
            "sentence_transformers_version": sentence_transformers.__version__}
    records = []
    with tempfile.TemporaryDirectory() as tmp:
        opts = SimpleNamespace(device=args.device, bf16=not args.no_bf16, seed=args.seed, rounds=args.rounds,
                               batch=batch, tmp=Path(tmp), host_split=not args.no_host_split,
                               profile_steps=args.profile_steps, device_name=device_name, compile=args.compile)
        compiled = [lib for lib in args.compile.split(",") if lib]
        if set(compiled) - set(LIBS):
            raise ValueError(f"--compile {args.compile!r}: give some of {', '.join(LIBS)}")
        opts.compile = {"bertkit" if lib == "bertkit" else "sentence_transformers" for lib in compiled}
        embedder, ce, mlm = checkpoints(Path(tmp), args.vocab, shape, args.seed)
        if args.device == "cuda":  # the CUDA context and cuBLAS are made here, not inside the first timed run
            torch.ones(256, 256, device="cuda") @ torch.ones(256, 256, device="cuda")
            torch.cuda.synchronize()
        dirs = {"embed_train": embedder, "encode": embedder, "rerank_train": ce, "ce_predict": ce,
                "sparse_train": mlm, "sparse_encode": mlm}
        for row in rows:
            records.append(guarded(run_row, row, dirs[row], data[row], opts, meta))
        for row in profiled:
            for lib in args.profile_libs.split(","):
                records.append(guarded(profile, row, dirs[row], data[row], opts, lib))
    return records


def guarded(fn, row: str, *args) -> dict:
    """``fn(row, ...)`` and its JSON line on stdout; a failure's line carries its error (the traceback on stderr)
    and the next row runs. What the libraries print meanwhile goes to stderr: the Trainers' log lines
    (``{'train_runtime': ...}``, transformers' PrinterCallback under ``disable_tqdm``) would otherwise sit between
    the JSON lines in gpu_check.sh's sentence.jsonl."""
    try:
        with contextlib.redirect_stdout(sys.stderr):
            record = fn(row, *args)
    except Exception as exc:  # one row's failure must not cost the other rows of a run on a lent machine
        traceback.print_exc()
        record = {"bench": "gpu_sentence" if fn is run_row else "gpu_sentence_profile", "row": row,
                  "error": f"{type(exc).__name__}: {exc}"[:2000]}
    print(json.dumps(record), flush=True)
    return record


if __name__ == "__main__":
    main()
