#!/usr/bin/env bash
# int8 against fp32 on fine-tuned task models (RESULTS.md, "int8 inference: task accuracy against fp32"), resumable:
#   1. fine-tune MiniLM (fp32) on SQuAD v1.1 (five-sixths of dev-v1.1.json's articles), SST-2 and CoNLL-2003 NER,
#      short runs: the table compares int8 with fp32 on the same model, not with published scores;
#   2. predict each dev set (SQuAD: the held-out sixth) with the same saved model in fp32, with --int8 (this CPU's
#      kernel: oneDNN at 8 bits where VNNI is), and on SQuAD with --int8 on the AVX2 class (fbgemm at 7 bits) by
#      emulating it; each report.json / scores line holds the metrics.
#   R=runs/int8-accuracy experiments/int8_accuracy.sh     (from the repository root; MODEL=models/minilm)
# Run it again to continue: a step whose output exists is skipped.
set -euo pipefail
R=${R:-runs/int8-accuracy}
BK=".venv/bin/python -m bertkit"
PY=".venv/bin/python"
M=${MODEL:-models/minilm}
D=${DATA:-../shared/data}
AVX2=(env ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 FBGEMM_ENABLE_INSTRUCTIONS=AVX2
      TORCHINDUCTOR_CACHE_DIR="$R/inductor-avx2")  # Inductor's cache key leaves the capability out (tests/conftest.py)
mkdir -p "$R"

finetune() {  # finetune NAME ARGS...: fine-tune once, fp32
  local name=$1; shift
  [ -d "$R/ft-$name" ] || $BK "$@" --model "$M" --output-dir "$R/ft-$name" --seed 1 --no-progress \
    > "$R/ft-$name.json" 2> "$R/ft-$name.log"
}
predict() {  # predict ARM PREFIX ARGS...: one arm's predictions into $R/ARM-NAME
  local out=$1; shift
  [ -d "$R/$out" ] || "$@" --output-dir "$R/$out" > "$R/$out.json"
}

finetune squad finetune squad --version 1.1 --predict-file "$D/squad/dev-v1.1.json" --max-train-samples 4000 \
  --num-train-epochs 1 --learning-rate 1e-4 --eval-strategy no
[ -f "$R/squad-heldout.json" ] || $PY - "$D/squad/dev-v1.1.json" "$R/squad-heldout.json" <<'PY'
import json, sys
from bertkit.tasks.squad import split_squad_articles
data = json.load(open(sys.argv[1], encoding="utf-8"))
_, heldout = split_squad_articles(data, 1 / 6, seed=0)  # the sixth finetune squad held out (split seed 0)
json.dump({"version": data.get("version", "1.1"), "data": heldout}, open(sys.argv[2], "w", encoding="utf-8"))
PY
SQUAD=(predict squad --predict-file "$R/squad-heldout.json" --model "$R/ft-squad/model")
predict fp32-squad $BK "${SQUAD[@]}"
predict int8-squad $BK "${SQUAD[@]}" --int8
predict int8-avx2-squad "${AVX2[@]}" $BK "${SQUAD[@]}" --int8

finetune sst2 finetune glue --task sst2 --data-dir "$D/glue" --max-train-samples 10000 --num-train-epochs 1 \
  --learning-rate 1e-4
SST2=(predict glue --task sst2 --data-dir "$D/glue" --split dev --model "$R/ft-sst2/best")
predict fp32-sst2 $BK "${SST2[@]}"
predict int8-sst2 $BK "${SST2[@]}" --int8

finetune ner finetune ner --data-dir "$D/conll2003" --max-train-samples 6000 --num-train-epochs 1 --learning-rate 1e-4
NER=(predict ner --data-file "$D/conll2003/valid.txt" --model "$R/ft-ner/model")
predict fp32-ner $BK "${NER[@]}"
predict int8-ner $BK "${NER[@]}" --int8
echo "done: scores in $R/*-{squad,sst2,ner}.json"
