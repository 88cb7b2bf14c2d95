#!/usr/bin/env bash
# Issue 14 §1 and §3: the NSP-negatives ablation (random vs nearby negatives, BERT-mini, equal budget) and
# pre-trained vs random initialisation on GLUE. Every step is resumable: run it again to continue.
#   R=runs/i14 experiments/issue14.sh            (from the repository root; CPU-bound, hours on 2 cores)
set -euo pipefail
R=${R:-runs/i14}
BK="nice -n 19 .venv/bin/python -m bertkit"
PY="nice -n 19 .venv/bin/python"
C=${CORPUS:-../shared/data/corpus}
G=${GLUE:-../shared/data/glue}
STEPS=${STEPS:-1500}
mkdir -p "$R"
[ -f "$R/vocab/vocab.txt" ] || $BK train-tokenizer $C/gutenberg/*.txt $C/wikipedia/*.md --output-dir "$R/vocab" \
    --vocab-size 30522 --no-progress
for neg in random nearby; do  # same corpus, vocabulary and seed; only the negatives differ
  [ -f "$R/data-$neg/manifest.json" ] || $BK create-pretraining-data $C/gutenberg/*.txt $C/wikipedia/*.md \
      --vocab "$R/vocab" --output-dir "$R/data-$neg" --max-seq-length 128 --dupe-factor 1 --nsp-negatives $neg \
      --seed 12345 --no-progress > "$R/data-$neg.json"
  [ -f "$R/eval-$neg/manifest.json" ] || $BK create-pretraining-data $C/wikitext-2/wiki.valid.raw --vocab "$R/vocab" \
      --output-dir "$R/eval-$neg" --max-seq-length 128 --dupe-factor 1 --nsp-negatives $neg --seed 777 \
      --no-progress > "$R/eval-$neg.json"
done
for neg in random nearby; do
  if [ ! -f "$R/pt-$neg/final/config.json" ]; then
    RES=""; [ -d "$R/pt-$neg" ] && RES="--overwrite"  # killed before its first checkpoint: start again
    [ -d "$R/pt-$neg/checkpoints" ] && RES="--resume"
    $BK pretrain --data "$R/data-$neg" --vocab "$R/vocab" --config-name mini --output-dir "$R/pt-$neg" \
      --max-steps $STEPS --batch-size 32 --learning-rate 5e-4 --warmup-ratio 0.05 --seed 42 --save-steps 250 \
      --eval-data "$R/eval-random" --eval-steps 500 --no-progress $RES > "$R/pt-$neg.json" 2>> "$R/pt-$neg.log"
  fi
done
# The 2 x 2 table: each arm on held-out WikiText-2 instances with random and with nearby negatives.
[ -s "$R/table-2x2.jsonl" ] || $PY experiments/pretrain_eval.py --model "$R/pt-random/final" "$R/pt-nearby/final" \
    --data "$R/eval-random" "$R/eval-nearby" > "$R/table-2x2.jsonl"
# The same network from random initialisation (same config, vocabulary and seed), for §3.
[ -f "$R/init-random/config.json" ] || $PY -c "
import sys, torch
from bertkit.config import BertConfig
from bertkit.heads import BertForPreTraining
from bertkit.tokenization import BertTokenizer
torch.manual_seed(42)
tok = BertTokenizer.from_pretrained('$R/vocab')
BertForPreTraining(BertConfig.preset('mini', vocab_size=len(tok.vocab))).save_pretrained('$R/init-random')
tok.save_pretrained('$R/init-random')"
mkdir -p "$R/glue"
# Downstream: sentence pairs (MRPC, RTE, STS-B) and single sentences (SST-2), 3 seeds each, default rate.
for task in ${TASKS:-mrpc rte stsb sst2}; do
  for init in pt-random/final pt-nearby/final init-random; do
    out="$R/glue/${init%%/*}-$task"
    [ -f "$out/report.json" ] && continue
    RES=""; [ -f "$out/.bertkit-run.json" ] && RES="--resume"
    $BK finetune glue --task $task --data-dir "$G" --model-name-or-path "$R/$init" --output-dir "$out" \
      --seed 1,2,3 --no-progress ${GLUE_ARGS:-} $RES > "$out.json" 2> "$out.log" || echo "failed: $out"
  done
done
echo ALL-DONE
