"""bench/gpu_check.sh's rows on a CPU at tiny sizes. A GPU machine is lent rarely and briefly, and a row that
crashes there costs the check: here each row's script runs with the arguments gpu_check.sh's `run` passes (read
from gpu_check.sh itself, expanded by bash), then the CPU and tiny sizes appended (argparse keeps an option's last
value), on data laid out as `gpu_check.sh prepare` lays out .gpu/. Its stdout must be JSON lines alone, carrying
the fields BENCHMARKS.md reads (ratios, throughputs, losses, output differences), finite. Peak memory and MFU are
measured on a GPU only (CUDA's counters, the GPU's bf16 peak): on a CPU the records must not claim them."""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from bench_helpers import json_lines
from bertkit import BertTokenizer
from bertkit.data.pretraining import create_pretraining_data

REPO = Path(__file__).resolve().parents[1]
GPU_CHECK = REPO / "bench" / "gpu_check.sh"

# Appended to each row's command: the CPU and tiny sizes (a 2-layer model, a few batches, one round).
TINY = {
    "sentence": ["--device", "cpu", "--smoke", "--rounds", "1"],
    "trainer": ["--device", "cpu", "--shape", "tiny", "--rows", "32", "--dev-rows", "64", "--rounds", "1"],
    "pretrain": ["--device", "cpu", "--shape", "tiny", "--batch-size", "8", "--steps", "1", "--warmup", "1",
                 "--rounds", "1"],
    "inference": ["--device", "cpu", "--shape", "tiny", "--sequences", "16", "--train-batches", "2",
                  "--repeats", "1"],
}


def gpu_check_commands() -> dict[str, list[str]]:
    """Each bench row's `python3 bench/X.py ARGS` in gpu_check.sh's `run`, as the words bash makes of it with the
    size variables (SCALE, TRAINER_ROWS, ...) unset: their defaults."""
    subprocess.run(["bash", "-n", str(GPU_CHECK)], check=True)
    text = GPU_CHECK.read_text(encoding="utf-8").replace("\\\n", " ")
    env = {k: v for k, v in os.environ.items() if k not in ("SCALE", "SENTENCE_ROWS", "TRAINER_ROWS")}
    commands = {}
    for row, args in re.findall(r"^\s*(\w+)\) python3 (bench/\S+\.py .*?) \| tee ", text, re.M):
        words = subprocess.run(["bash", "-c", f'printf "%s\\0" {args}'], env=env, capture_output=True, text=True,
                               check=True).stdout
        commands[row] = words.split("\0")[:-1]
    return commands


@pytest.fixture(scope="module")
def gpu_dir(tmp_path_factory, data_dir, minilm_dir) -> Path:
    """What `gpu_check.sh prepare` puts in .gpu/ (instances from 3 articles, not 80)."""
    gpu = tmp_path_factory.mktemp("gpu")
    for sub in ("squad", "glue", "vocab"):
        (gpu / sub).mkdir()
    (gpu / "squad" / "dev-v1.1.json").symlink_to(data_dir / "squad" / "dev-v1.1.json")
    (gpu / "glue" / "SST-2").symlink_to(data_dir / "glue" / "SST-2")
    for name in ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(minilm_dir / name, gpu / "vocab" / name)
    articles = sorted((data_dir / "corpus" / "wikipedia").glob("*.md"))[:3]
    create_pretraining_data(articles, BertTokenizer.from_pretrained(gpu / "vocab"), gpu / "pretrain",
                            max_seq_length=128, dupe_factor=1, seed=7, num_workers=1, progress=False)
    return gpu


def finite(record: dict, *keys: str) -> None:
    for key in keys:
        value = record.get(key)
        assert isinstance(value, (int, float)) and math.isfinite(value) and value >= 0, (key, value, record)


def check_sentence(records: list[dict]) -> None:
    assert [r["row"] for r in records] == ["embed_train", "rerank_train", "encode", "ce_predict", "sparse_train",
                                           "sparse_encode"]
    for r in records:
        assert "error" not in r, r
        finite(r, "ratio", "sentence_transformers_per_s", "bertkit_per_s")
        if r["row"].endswith("_train"):  # the same 4 steps from the same weights: losses within bf16's reach
            finite(r, "sentence_transformers_loss_mean", "bertkit_loss_mean")
            assert r["sentence_transformers_steps"] == r["bertkit_steps"] > 0
            assert abs(r["sentence_transformers_loss_mean"] - r["bertkit_loss_mean"]) < 0.05, r
        else:  # fp32 outputs of the same weights
            finite(r, "max_abs_diff")
            assert r["max_abs_diff"] < 1e-4 and r.get("same_indices", True), r
        assert "memory_ratio" not in r  # CUDA's peak counters only


def check_trainer(records: list[dict]) -> None:
    (r,) = records
    finite(r, "speedup_train", "speedup_train_grouped", "speedup_eval")
    for run in ("bertkit", "bertkit_grouped", "transformers"):
        finite(r[run], "train_s", "eval_s", "training_loss", "dev_accuracy")
        assert r[run]["steps"] == 1 and "peak_gb" not in r[run], r
    assert abs(r["bertkit"]["training_loss"] - r["transformers"]["training_loss"]) < 0.01, r  # one batch, same order


def check_pretrain(records: list[dict]) -> None:
    (r,) = records
    variants = ("transformers", "bertkit", "transformers_compiled", "bertkit_compiled", "bertkit_compiled_model")
    finite(r, "speedup", "speedup_compiled", "speedup_compiled_vs_transformers", "useful_gflop_per_step",
           "model_gflop_per_step", "padding_fraction", *(f"{v}_seq_per_s" for v in variants))
    assert not any(key.endswith("_mfu") for key in r), r  # over a GPU's bf16 peak only


def check_inference(records: list[dict]) -> None:
    assert [(r["workload"], r["precision"]) for r in records] == [
        (w, p) for w in ("short", "windows", "train", "train_windows") for p in ("fp32", "tf32", "bf16")]
    for r in records:
        finite(r, "speedup", "speedup_padded", "speedup_unpadded", "transformers_seq_per_s", "bertkit_seq_per_s")
        if not r["workload"].startswith("train"):  # bertkit's hidden state against transformers' at real tokens
            finite(r, "max_diff")
            assert r["max_diff"] < (1e-4 if r["precision"] != "bf16" else 0.05), r


CHECKS = {"sentence": check_sentence, "trainer": check_trainer, "pretrain": check_pretrain,
          "inference": check_inference}


@pytest.mark.slow
@pytest.mark.parametrize("row", sorted(CHECKS))
def test_gpu_check_row_runs_on_cpu(row, gpu_dir):
    commands = gpu_check_commands()
    assert sorted(commands) == sorted(CHECKS), f"gpu_check.sh's bench rows changed: {sorted(commands)}"
    argv = [str(gpu_dir) + w[len(".gpu"):] if w == ".gpu" or w.startswith(".gpu/") else w for w in commands[row]]
    # TORCH_COMPILE_DISABLE: --compile's variants are built and run, without minutes of C++ compilation
    env = {**os.environ, "PYTHONPATH": "src", "PYTHONUNBUFFERED": "1", "TORCH_COMPILE_DISABLE": "1"}
    # a bound for a hung run, not a speed check: the sentence row alone took 77 s idle and over 170 s beside the slow
    # suite's other process on 2 busy cores
    done = subprocess.run([sys.executable, *argv, *TINY[row]], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    CHECKS[row](json_lines(done, f"{row}'s stdout (gpu_check.sh's {row}.jsonl)"))


def test_prepare_output_is_git_ignored_without_writing_git_metadata():
    """`prepare` wrote .git/info/exclude, which a checkout made by `git worktree add` does not have (.git is a file
    there): prepare stopped at once ('.git/info/exclude: Not a directory', exit 1). .gitignore ignores both folders."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    prepare = re.search(r"^prepare\(\) \{\n(.*?)^\}", GPU_CHECK.read_text(encoding="utf-8"), re.M | re.S).group(1)
    assert not [line for line in prepare.splitlines() if ".git/" in line.split("#")[0]], prepare
    done = subprocess.run(["git", "check-ignore", "--no-index", ".gpu/out/sentence.jsonl", ".whl/datasets.whl"],
                          cwd=REPO, capture_output=True, text=True)
    assert done.stdout.split() == [".gpu/out/sentence.jsonl", ".whl/datasets.whl"], done
