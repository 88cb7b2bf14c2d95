#!/usr/bin/env bash
# int8 against fp32 on fine-tuned task models (BENCHMARKS.md, "int8 accuracy"), in one resumable script:
#   1. fine-tune MiniLM (fp32) on SST-2, MRPC, STS-B, CoNLL-2003 NER and SQuAD v1.1 (short runs: the table
#      compares int8 with fp32 on the same model, not with published scores);
#   2. predict each task's dev set twice with the same saved model: fp32, then `--int8` (default
#      calibration: the 256 built-in sentences);
#   3. print the table: python experiments/int8_accuracy_table.py --runs runs/int8-accuracy
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
predict() {  # predict NAME ARGS...: the same model in fp32 and in int8
  local name=$1; shift
  done_ "$R/fp32-$name" || $BK "$@" --output-dir "$R/fp32-$name" --overwrite > "$R/fp32-$name.json"
  done_ "$R/int8-$name" || $BK "$@" --int8 --output-dir "$R/int8-$name" --overwrite > "$R/int8-$name.json"
}

# Sentence and pair classification, regression (GLUE dev).
finetune sst2 finetune glue --task sst2 --data-dir "$D/glue" --max-train-samples 10000 --num-train-epochs 1 \
  --learning-rate 1e-4
finetune mrpc finetune glue --task mrpc --data-dir "$D/glue" --num-train-epochs 3 --learning-rate 1e-4
finetune stsb finetune glue --task stsb --data-dir "$D/glue" --num-train-epochs 2 --learning-rate 1e-4
for task in sst2 mrpc stsb; do
  predict $task predict glue --task $task --data-dir "$D/glue" --split dev --model "$R/ft-$task/best"
done

# Token classification (CoNLL-2003 dev, conlleval's entity F1).
finetune ner finetune ner --data-dir "$D/conll2003" --max-train-samples 6000 --num-train-epochs 1 --learning-rate 1e-4
predict ner predict ner --data-file "$D/conll2003/valid.txt" --model "$R/ft-ner/model"

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
predict squad predict squad --predict-file "$R/squad-heldout.json" --model "$R/ft-squad/model"
echo "done: $PY experiments/int8_accuracy_table.py --runs $R"
