"""The CPU benchmark scripts in bench/ at their smallest sizes, run as BENCHMARKS.md runs them: each prints its
JSON line(s) on stdout and nothing else there (a log line in stdout breaks `| tee x.jsonl` and every reader of
it), and an engine whose optional package is absent can be left out with --engines, or is refused naming the
package and that flag, never a traceback."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench_helpers import json_lines

REPO = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.slow


def bench(script: str, *argv, timeout: int = 170) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": "src", "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, f"bench/{script}.py", *map(str, argv)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_checkpoint_write_prints_one_json_line(minilm_dir):
    # transformers' Trainer printed "{'loss': '0.6942', ...}" to stdout before the result
    (record,) = json_lines(bench("bench_checkpoint_write", "--model", minilm_dir, "--steps", 1))
    assert record["checkpoints"] == 1 and record["ratio_median"] > 0


def test_sparse_prints_one_json_line_and_the_same_vectors(minilm_dir, data_dir):
    # sentence-transformers' trainer printed "{'train_runtime': ...}" to stdout before the result
    (record,) = json_lines(
        bench(
            "bench_sparse",
            "--model",
            minilm_dir,
            "--data",
            data_dir,
            "--paragraphs",
            2,
            "--questions",
            2,
            "--threads",
            1,
            "--rounds",
            1,
            "--train-steps",
            1,
            "--train-batch",
            2,
        )
    )
    assert record["threads_1"]["same_indices"] is True and record["threads_1"]["max_abs_diff"] < 1e-4


def test_sparse_head_prints_one_json_line_with_each_screen_checked(minilm_dir):
    import torch

    from bertkit.sentence.sparse_encoder.screen import screened_max_logits

    (record,) = json_lines(bench("bench_sparse_head", "--model", minilm_dir, "--texts", 2, "--calls", 1))
    assert record["active"] > 0 and record["fp32_ms"] > 0
    if screened_max_logits(torch.zeros(4, 2), torch.zeros(4)) is None:  # no exact int8 product here (AVX2)
        assert "int8_ms" not in record
    else:  # the screen's vectors were checked against the fp32 head before it was timed
        assert record["int8_recomputed"] >= record["active"] and record["int8_ms"] > 0


def test_embeddings_runs_without_the_engines_it_leaves_out(minilm_dir, data_dir):
    # fastembed was imported even with --engines leaving it out: ModuleNotFoundError where it is not installed
    records = json_lines(
        bench(
            "bench_embeddings",
            "--model",
            minilm_dir,
            "--data",
            data_dir,
            "--sentences",
            8,
            "--threads",
            1,
            "--rounds",
            1,
            "--engines",
            "sentence-transformers-torch",
        )
    )
    timed = {r["engine"]: r for r in records if "skipped" not in r}
    assert sorted(timed) == ["bertkit-fp32", "sentence-transformers-torch"]
    assert timed["sentence-transformers-torch"]["min_cos"] > 0.9999


@pytest.mark.skipif(importlib.util.find_spec("fastembed") is not None, reason="fastembed is installed here")
def test_embeddings_refuses_a_missing_fastembed_naming_the_fix(minilm_dir, data_dir):
    done = bench(
        "bench_embeddings", "--model", minilm_dir, "--data", data_dir, "--sentences", 8, "--rounds", 1
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "needs fastembed" in done.stderr and "--engines" in done.stderr


@pytest.mark.skipif(
    importlib.util.find_spec("nncf") is not None and importlib.util.find_spec("openvino") is not None,
    reason="OpenVINO and NNCF are installed here",
)
def test_engines_refuses_a_missing_package_naming_the_fix(minilm_dir, data_dir):
    # the default engines imported nncf after minutes of ONNX export and quantization: ModuleNotFoundError
    done = bench(
        "bench_engines",
        "--model",
        minilm_dir,
        "--data",
        data_dir,
        "--threads",
        1,
        "--rounds",
        1,
        "--sentences",
        8,
        "--workloads",
        "short",
        "--engines",
        "openvino-fp32",
    )
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-3000:]
    assert "the openvino engines need" in done.stderr and "--engines" in done.stderr


def test_sentence_training_takes_the_data_folder_and_refuses_a_missing_file(
    monkeypatch, minilm_dir, data_dir
):
    # --data /work/shared/data (the folder every other bench takes) ended in FileNotFoundError's traceback
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import bench_sentence_training as bench_st

    seen = []

    def script(
        lib, model, out, train, ir_data, seed
    ):  # the two trainings stand in: the data is what is checked
        seen.append((lib, len(train), len(ir_data[0])))
        return {"train_pairs_per_s": 1.0, "encode_paragraphs_per_s": 1.0}

    monkeypatch.setattr(bench_st, "script", script)
    argv = ["--model", str(minilm_dir), "--limit", "16", "--held-out-articles", "1", "--eval-queries", "8"]
    record = bench_st.main([*argv, "--data", str(data_dir)])
    assert record["pairs"] == 16 and seen == [("sentence_transformers", 16, 8), ("bertkit", 16, 8)]
    with pytest.raises(
        SystemExit, match=r"--data .*nowhere\.json is not a file: give SQuAD v1\.1's dev-v1\.1\.json"
    ):
        bench_st.main([*argv, "--data", str(data_dir / "nowhere.json")])


@pytest.mark.parametrize(
    "script,argv,message",
    [  # a misspelt name dropped its rows without a word: bench_datapath printed "rows": {} (exit 0)
        (
            "bench_datapath",
            ["--rows", "encode,ce-predict"],
            "--rows: unknown ['ce-predict']; give some of embed_train",
        ),
        (
            "bench_pipeline",
            ["--impls", "transformers-sort"],
            "--impls: unknown ['transformers-sort']; give some of",
        ),
    ],
)
def test_a_misspelt_row_is_refused_by_name(script, argv, message, minilm_dir, data_dir):
    done = bench(script, "--model", minilm_dir, "--data", data_dir, *argv, timeout=120)
    assert done.returncode == 1 and message in done.stderr and not done.stdout, (
        done.stdout,
        done.stderr[-2000:],
    )


def test_serve_limits_refuses_an_only_that_selects_nothing(minilm_dir):
    # --only in no kind's name started no server and printed "rows": [] (exit 0)
    done = bench("bench_serve_limits", "--model", minilm_dir, "--only", "fill mask", timeout=60)
    assert done.returncode == 1 and not done.stdout, (done.stdout, done.stderr[-2000:])
    assert "--only 'fill mask' is in no kind's name; the kinds: qa: 16 questions" in done.stderr


def test_pipeline_squad_runs_bertkit_at_transformers_window_length(monkeypatch, minilm_dir, data_dir):
    # bertkit's question-answering pipeline ran at the model's 512 positions against transformers' 384 windows
    monkeypatch.syspath_prepend(str(REPO / "bench"))
    import bench_pipeline

    made = []

    def pipeline(task, model, **kwargs):
        made.append((task, kwargs.get("max_length")))
        return lambda inputs: [{"answer": ""} for _ in inputs]

    monkeypatch.setattr(bench_pipeline.bertkit, "pipeline", pipeline)
    monkeypatch.setattr(bench_pipeline, "hf_qa", lambda model, tok, items, *a: [""] * len(items))
    argv = ["bench_pipeline.py", "--model", str(minilm_dir), "--data", str(data_dir), "--limit", "2"]
    monkeypatch.setattr(sys, "argv", [*argv, "--workloads", "squad", "--impls", "transformers-sorted"])
    bench_pipeline.main()
    assert made == [("question-answering", 384)]
