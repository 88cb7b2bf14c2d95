#!/usr/bin/env bash
# The GPU check: every GPU row of BENCHMARKS.md, bertkit against the reference in one process each, plus
# tests/test_cuda.py. A device machine receives the repository alone (not ../shared/data, not the ignored
# models/), so the check runs in two steps:
#
#   bench/gpu_check.sh prepare          # here: copies what the rows read into .gpu/ and the wheels of datasets
#                                       # (sentence-transformers' trainers import it) into .whl/, both git-ignored
#                                       # (.gitignore); PYTHON: the Python with bertkit and pip (.venv/bin/python)
#   bench/gpu_check.sh run [ROWS]       # there, with .gpu and .whl carried; ROWS: comma-separated of
#                                       # tests,sentence,trainer,pretrain,inference (default: all)
#
# Each row writes its output to $OUT (default .gpu/out): test_cuda.txt, then one JSONL file per bench script.
# tests/test_gpu_check.py reads the bench rows' command lines below and runs them on a CPU at tiny sizes.
# Sizes: SCALE (bench_gpu_sentence's --scale, default 0.5), SENTENCE_ROWS (its --rows, default all),
# TRAINER_ROWS (bench_trainer's --rows, default 3000), PY_VERSION (the device's Python for the wheels, default 3.12).
set -euo pipefail
cd "$(dirname "$0")/.."
DATA=${DATA:-../shared/data}
MODEL=${MODEL:-models/minilm}

prepare() {
    # .gpu/ and .whl/ are ignored by .gitignore: a checkout made with `git worktree add` has a .git file, not a
    # directory, so writing .git/info/exclude stopped prepare there ('.git/info/exclude: Not a directory')
    local py=${PYTHON:-.venv/bin/python}
    mkdir -p .gpu/squad .gpu/glue .gpu/vocab .gpu/corpus
    cp "$DATA/squad/dev-v1.1.json" .gpu/squad/
    rm -rf .gpu/glue/SST-2 && cp -r "$DATA/glue/SST-2" .gpu/glue/ && chmod -R u+w .gpu/glue
    cp "$MODEL"/{vocab.txt,tokenizer_config.json,special_tokens_map.json} .gpu/vocab/
    # Pre-training instances at 128 tokens for bench_pretrain (11 steps of 256 sequences and more).
    cp $(ls "$DATA"/corpus/wikipedia/*.md | head -80) .gpu/corpus/
    "$py" -m bertkit create-pretraining-data --vocab .gpu/vocab --output-dir .gpu/pretrain --overwrite \
        --max-seq-length 128 --dupe-factor 1 --seed 7 --no-progress .gpu/corpus/*.md
    rm -rf .gpu/corpus
    "$py" -m pip download -q --no-deps --only-binary=:all: --python-version "${PY_VERSION:-3.12}" \
        --implementation cp --platform manylinux2014_x86_64 -d .whl datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
    du -sh .gpu .whl
}

run() {
    local rows=${1:-tests,sentence,trainer,pretrain,inference} out=${OUT:-.gpu/out}
    mkdir -p "$out"
    python3 -c "import datasets" 2>/dev/null || {
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
        export PYTHONPATH=/tmp/site; }
    export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}src PYTHONUNBUFFERED=1 BERTKIT_TEST_MODEL=.gpu/vocab
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/device.txt"
    python3 -c "import torch, transformers, sentence_transformers as st; print(torch.__version__, transformers.__version__, st.__version__)" | tee -a "$out/device.txt"
    local row
    for row in ${rows//,/ }; do
        echo "== $row $(date +%T)"
        case $row in
            tests) python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py > "$out/test_cuda.txt" 2>&1 || true
                   tail -3 "$out/test_cuda.txt" ;;
            sentence) python3 bench/bench_gpu_sentence.py --data .gpu --vocab .gpu/vocab --no-host-split \
                          --scale "${SCALE:-0.5}" ${SENTENCE_ROWS:+--rows "$SENTENCE_ROWS"} | tee "$out/sentence.jsonl" ;;
            trainer) python3 bench/bench_trainer.py --model .gpu/vocab --shape base --device cuda --bf16 \
                         --data-dir .gpu/glue/SST-2 --rows "${TRAINER_ROWS:-3000}" --rounds 2 | tee "$out/trainer.jsonl" ;;
            pretrain) python3 bench/bench_pretrain.py --device cuda --shape base --batch-size 256 --bf16 --compile \
                          --steps 8 --warmup 3 --rounds 2 --data .gpu/pretrain --model .gpu/vocab | tee "$out/pretrain.jsonl" ;;
            inference) python3 bench/bench_gpu.py --vocab .gpu/vocab --data .gpu | tee "$out/inference.jsonl" ;;
            *) echo "unknown row $row: use tests,sentence,trainer,pretrain,inference" >&2; exit 2 ;;
        esac
    done
}

case ${1:-} in
    prepare) prepare ;;
    run) run "${2:-}" ;;
    *) echo "usage: bench/gpu_check.sh prepare | run [tests,sentence,trainer,pretrain,inference]" >&2; exit 2 ;;
esac
