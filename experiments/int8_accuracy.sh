#!/usr/bin/env bash
# int8 against fp32 on fine-tuned task models (BENCHMARKS.md, "int8 accuracy"), in one resumable script:
#   1. fine-tune MiniLM (fp32) on SST-2, MRPC, STS-B, CoNLL-2003 NER and SQuAD v1.1 (short runs: the table
#      compares int8 with fp32 on the same model, not with published scores);
#   2. predict each task's dev set four times with the same saved model: fp32, `--int8` (default
#      calibration: the 256 built-in sentences), the directory `bertkit quantize` writes from it, and the one
#      `bertkit quantize --fast` writes (CPUs with AVX512-VNNI; ffn_out int8 with per-token scales), each with what
#      stays float in fp32 (`--no-bf16`), and on CPUs with native bf16 the `--int8` and `--fast` arms again with it
#      in bf16 (`--bf16`, their default there);
#   3. print the tables: python experiments/int8_accuracy_table.py --runs runs/int8-accuracy [--arm saved|fast|int8bf16|fastbf16]
#   R=runs/int8-accuracy experiments/int8_accuracy.sh     (from the repository root; MODEL=models/minilm)
# Run it again to continue: a step whose report.json exists is skipped.
set -euo pipefail
R=${R:-runs/int8-accuracy}
BK=".venv/bin/python -m bertkit"
PY=".venv/bin/python"
M=${MODEL:-models/minilm}
D=${DATA:-../shared/data}
mkdir -p "$R"

done_() { [ -f "$1/report.json" ]; }
finetune() {  # finetune NAME ARGS...: fine-tune once, fp32
  local name=$1; shift
  done_ "$R/ft-$name" || $BK "$@" --model "$M" --output-dir "$R/ft-$name" --seed 1 --no-progress --overwrite \
    > "$R/ft-$name.json" 2> "$R/ft-$name.log"
}
predict() {  # predict NAME MODEL ARGS...: the same model in fp32, in int8 (--int8), and saved in int8 first
  local name=$1 model=$2; shift 2
  done_ "$R/fp32-$name" || $BK "$@" --model "$model" --output-dir "$R/fp32-$name" --overwrite > "$R/fp32-$name.json"
  done_ "$R/int8-$name" || $BK "$@" --model "$model" --int8 --no-bf16 --output-dir "$R/int8-$name" --overwrite \
    > "$R/int8-$name.json"
  [ -f "$R/q-$name/model.int8.safetensors" ] || $BK quantize --model "$model" --output-dir "$R/q-$name" --overwrite \
    > "$R/q-$name.json"
  done_ "$R/saved-$name" || $BK "$@" --model "$R/q-$name" --no-bf16 --output-dir "$R/saved-$name" --overwrite \
    > "$R/saved-$name.json"
  # The int8, saved and fast arms keep what stays float in fp32 (--no-bf16); the int8bf16 and fastbf16 arms run it
  # in bf16 (--bf16), which is what --int8 and int8 directories do by default on CPUs with AVX512-BF16 or AMX.
  local bf16=0
  $PY -c "from bertkit._hardware import cpu_has_bf16 as s; raise SystemExit(not s())" && bf16=1
  [ $bf16 = 0 ] || done_ "$R/int8bf16-$name" || $BK "$@" --model "$model" --int8 --bf16 \
    --output-dir "$R/int8bf16-$name" --overwrite > "$R/int8bf16-$name.json"
  $PY -c "from bertkit.quantization import per_token_supported as s; raise SystemExit(not s())" || return 0
  [ -f "$R/qf-$name/model.int8.safetensors" ] || $BK quantize --model "$model" --output-dir "$R/qf-$name" --fast \
    --overwrite > "$R/qf-$name.json"
  done_ "$R/fast-$name" || $BK "$@" --model "$R/qf-$name" --no-bf16 --output-dir "$R/fast-$name" --overwrite \
    > "$R/fast-$name.json"
  [ $bf16 = 0 ] || done_ "$R/fastbf16-$name" || $BK "$@" --model "$R/qf-$name" --bf16 \
    --output-dir "$R/fastbf16-$name" --overwrite > "$R/fastbf16-$name.json"
}

# Sentence and pair classification, regression (GLUE dev).
finetune sst2 finetune glue --task sst2 --data-dir "$D/glue" --max-train-samples 10000 --num-train-epochs 1 \
  --learning-rate 1e-4
finetune mrpc finetune glue --task mrpc --data-dir "$D/glue" --num-train-epochs 3 --learning-rate 1e-4
finetune stsb finetune glue --task stsb --data-dir "$D/glue" --num-train-epochs 2 --learning-rate 1e-4
for task in sst2 mrpc stsb; do
  predict $task "$R/ft-$task/best" predict glue --task $task --data-dir "$D/glue" --split dev
done

# Token classification (CoNLL-2003 dev, conlleval's entity F1).
finetune ner finetune ner --data-dir "$D/conll2003" --max-train-samples 6000 --num-train-epochs 1 --learning-rate 1e-4
predict ner "$R/ft-ner/model" predict ner --data-file "$D/conll2003/valid.txt"

# Span extraction: the only SQuAD file here is dev-v1.1.json; finetune squad trains on 5/6 of its articles
# (split seed 0) and both arms answer the held-out sixth, written out by the same split function.
finetune squad finetune squad --version 1.1 --predict-file "$D/squad/dev-v1.1.json" --max-train-samples 4000 \
  --num-train-epochs 1 --learning-rate 1e-4
[ -f "$R/squad-heldout.json" ] || $PY - "$D/squad/dev-v1.1.json" "$R/squad-heldout.json" <<'EOF'
import json, sys
from bertkit.tasks.squad import split_squad_articles
data = json.load(open(sys.argv[1], encoding="utf-8"))
_, heldout = split_squad_articles(data, 1 / 6, seed=0)
json.dump({"version": data.get("version", "1.1"), "data": heldout}, open(sys.argv[2], "w", encoding="utf-8"))
EOF
predict squad "$R/ft-squad/model" predict squad --predict-file "$R/squad-heldout.json"
echo "done: $PY experiments/int8_accuracy_table.py --runs $R"
