#!/usr/bin/env bash
# Issue 14 §2: the paper's 128 -> 512 schedule on real text, as google-research/bert runs it: the second
# phase is its own run initialised from the 128-token model (run_pretraining.py --init_checkpoint), on
# 512-token instances, for 10% of the total steps (167 after 1,500). Its rate continues the single linear
# schedule the paper describes: 5e-5 (about where 5e-4 decaying to 0 over 1,667 steps stands at step
# 1,500), no warm-up, decaying to 0. Resumable: run it again to continue.
#   R=runs/i14 P=runs/i14p2 experiments/issue14_phase2.sh     (after experiments/issue14.sh made pt-random)
set -euo pipefail
R=${R:-runs/i14}
P=${P:-runs/i14p2}
BK="nice -n 19 .venv/bin/python -m bertkit"
PY="nice -n 19 .venv/bin/python"
C=${CORPUS:-../shared/data/corpus}
mkdir -p "$P"
# 512-token instances: Wikipedia articles for training (long documents fill 512 tokens), WikiText-2 valid held out.
[ -f "$P/data512/manifest.json" ] || $BK create-pretraining-data $C/wikipedia/*.md --vocab "$R/vocab" \
    --output-dir "$P/data512" --max-seq-length 512 --dupe-factor 1 --seed 12345 --no-progress > "$P/data512.json"
[ -f "$P/eval512/manifest.json" ] || $BK create-pretraining-data $C/wikitext-2/wiki.valid.raw --vocab "$R/vocab" \
    --output-dir "$P/eval512" --max-seq-length 512 --dupe-factor 1 --seed 777 --no-progress > "$P/eval512.json"
if [ ! -f "$P/pt-512/final/config.json" ]; then
  RES=""; [ -d "$P/pt-512" ] && RES="--overwrite"  # killed before its first checkpoint: start again
  [ -d "$P/pt-512/checkpoints" ] && RES="--resume"
  $BK pretrain --data "$P/data512" --vocab "$R/vocab" --init-from "$R/pt-random/final" --output-dir "$P/pt-512" \
    --max-steps 167 --batch-size 32 --learning-rate 5e-5 --warmup-ratio 0 --seed 42 --save-steps 50 \
    --eval-data "$P/eval512" --eval-steps 50 --no-progress $RES > "$P/pt-512.json" 2>> "$P/pt-512.log"
fi
# Before (the 128-only model) and after the 512 phase, on held-out 512- and 128-token instances.
[ -s "$P/table-phase.jsonl" ] || $PY experiments/pretrain_eval.py --model "$R/pt-random/final" "$P/pt-512/final" \
    --data "$P/eval512" "$R/eval-random" --batch-size 16 > "$P/table-phase.jsonl"
echo PHASE2-DONE
