#!/usr/bin/env bash
# Issue 14 §3, continued: does more pre-training lift the network off the context-free plateau where the
# 2,500-step arms stopped? The random-negative arm's final model trains STEPS more steps at 128 tokens
# (its own schedule: warm-up 5%, linear decay), is scored on the held-out sets, and is fine-tuned on SST-2
# and STS-B like the arms. Run after experiments/issue14.sh; resumable like it.
#   R=runs/i14 experiments/issue14_longer.sh
set -euo pipefail
R=${R:-runs/i14}
BK="nice -n 19 .venv/bin/python -m bertkit"
PY="nice -n 19 .venv/bin/python"
G=${GLUE:-../shared/data/glue}
STEPS=${STEPS:-3000}
LR=${LR:-5e-4}
out="$R/pt-random-longer"
if [ ! -f "$out/final/config.json" ]; then
  res=""
  [ -d "$out" ] && res="--overwrite"
  [ -d "$out/checkpoints" ] && res="--resume"
  $BK pretrain --data "$R/data-random" --vocab "$R/vocab" --init-from "$R/pt-random/final" --output-dir "$out" \
    --max-steps "$STEPS" --batch-size 32 --learning-rate "$LR" --warmup-ratio 0.05 --seed 43 --save-steps 500 \
    --eval-data "$R/eval-random" --eval-steps 500 --no-progress $res > "$out.json" 2>> "$out.log"
fi
if [ ! -s "$R/heldout-longer.jsonl" ]; then
  $PY experiments/pretrain_eval.py --model "$out/final" --data "$R/eval-random" "$R/eval-nearby" \
    "$R/eval512-random" --batch-size 16 > "$R/heldout-longer.jsonl.part"
  mv "$R/heldout-longer.jsonl.part" "$R/heldout-longer.jsonl"
fi
for task in sst2 stsb; do
  ft="$R/glue/pt-random-longer-$task" res="" extra=""
  [ -f "$ft/report.json" ] && continue
  [ -f "$ft/.bertkit-run.json" ] && res="--resume"
  [ "$task" = sst2 ] && extra="--max-train-samples 10000"
  $BK finetune glue --task "$task" --data-dir "$G" --model-name-or-path "$out/final" --output-dir "$ft" \
    --seed 1,2,3 --no-progress $extra $res > "$ft.json" 2> "$ft.log" || echo "failed: $ft"
done
echo LONGER-DONE
