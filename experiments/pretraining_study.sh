#!/usr/bin/env bash
# The pre-training study of RESULTS.md (sections 1-3) in one resumable script: the NSP-negatives ablation
# (random vs nearby negatives at equal budget), the paper's 90% at 128 / 10% at 512 schedule through
# pretrain's own phase switch, and the pre-trained networks against the same network from random
# initialisation on GLUE.
#   R=runs/pretraining-study experiments/pretraining_study.sh   (from the repository root; about 2 h of both cores)
#   python experiments/pretraining_study_tables.py --runs runs/pretraining-study --figures docs/img
#       (RESULTS.md's tables and curves)
# Run it again to continue: every step skips what is done and resumes what was cut.
#
# Both arms share the corpus, vocabulary, model shape, steps, schedule, batch order (seed) and seed; only
# the negatives of their instances differ. They run side by side, one thread each, so a load that comes
# and goes falls on both alike.
set -euo pipefail
R=${R:-runs/pretraining-study}
BK="nice -n 19 .venv/bin/python -m bertkit"
PY="nice -n 19 .venv/bin/python"
C=${CORPUS:-../shared/data/corpus}
G=${GLUE:-../shared/data/glue}
SHAPE=${SHAPE:-tiny}     # BERT-tiny (L2 H128): about an hour per arm on this 2-core machine
STEPS=${STEPS:-2500}     # all steps; phase 1 (128 tokens) ends at 90% of them, as in appendix A.2
LR=${LR:-1e-3}
SWITCH=$(( STEPS * 9 / 10 ))
TEXT=("$C"/gutenberg/*.txt "$C"/wikipedia/*.md)
mkdir -p "$R"
[ -f "$R/vocab/vocab.txt" ] || $BK train-tokenizer "${TEXT[@]}" --output-dir "$R/vocab" --vocab-size 30522 --no-progress
make_data() {  # make_data OUT LENGTH NEGATIVES SEED TEXT...
  local out=$1 len=$2 neg=$3 seed=$4; shift 4
  [ -f "$R/$out/manifest.json" ] || $BK create-pretraining-data "$@" --vocab "$R/vocab" --output-dir "$R/$out" \
      --max-seq-length "$len" --dupe-factor 1 --nsp-negatives "$neg" --seed "$seed" --no-progress > "$R/$out.json"
}
for neg in random nearby; do
  make_data "data-$neg" 128 "$neg" 12345 "${TEXT[@]}"
  make_data "data512-$neg" 512 "$neg" 12345 "${TEXT[@]}"
  make_data "eval-$neg" 128 "$neg" 777 "$C/wikitext-2/wiki.valid.raw"
done
make_data eval512-random 512 random 777 "$C/wikitext-2/wiki.valid.raw"

pretrain_run() {  # pretrain_run OUT PRETRAIN_ARGS...: start, resume or skip one pre-training run
  local out=$1 res=""; shift
  [ -f "$out/final/config.json" ] && return 0
  [ -d "$out" ] && res="--overwrite"        # killed before its first checkpoint: start again
  [ -d "$out/checkpoints" ] && res="--resume"
  $BK pretrain --output-dir "$out" --vocab "$R/vocab" --batch-size 32 --warmup-ratio 0.05 --eval-data "$R/eval-random" \
    --no-progress "$@" $res > "$out.json" 2>> "$out.log"
}
pretrain_arm() {  # pretrain_arm NEGATIVES
  OMP_NUM_THREADS=1 pretrain_run "$R/pt-$1" --data "$R/data-$1" --phase2-data "$R/data512-$1" --phase1-fraction 0.9 \
    --config-name "$SHAPE" --max-steps "$STEPS" --learning-rate "$LR" --seed 42 --save-steps 250 --eval-steps 250
}
pretrain_arm random & pa=$!
pretrain_arm nearby & pb=$!
wait $pa; wait $pb

# Held-out scores of each arm at the phase switch (128 tokens only) and at the end (after the 512 phase), on
# WikiText-2 valid instances with random negatives, with nearby negatives, and 512 tokens long.
CK=$(printf "checkpoints/step-%08d" "$SWITCH")
heldout() {  # heldout OUT.jsonl MODEL...: every held-out instance scored, written once complete
  local out=$1; shift
  [ -s "$out" ] && return 0
  $PY experiments/pretrain_eval.py --model "$@" --data "$R/eval-random" "$R/eval-nearby" "$R/eval512-random" \
    --batch-size 16 > "$out.part"
  mv "$out.part" "$out"
}
heldout "$R/heldout.jsonl" "$R/pt-random/$CK" "$R/pt-nearby/$CK" "$R/pt-random/final" "$R/pt-nearby/final"
# What a predictor that reads no context scores on the same sets (the floor a model must clear).
[ -s "$R/baseline.jsonl" ] || $PY experiments/pretrain_eval.py --data "$R/eval-random" "$R/eval-nearby" \
    "$R/eval512-random" --baseline "$R/data-random" --vocab "$R/vocab" > "$R/baseline.jsonl"

# The same network from random initialisation (same config, vocabulary and seed), for §3.
[ -f "$R/init-random/config.json" ] || $PY -c "
import torch
from bertkit.config import BertConfig
from bertkit.heads import BertForPreTraining
from bertkit.tokenization import BertTokenizer
torch.manual_seed(42)
tok = BertTokenizer.from_pretrained('$R/vocab')
BertForPreTraining(BertConfig.preset('$SHAPE', vocab_size=len(tok.vocab))).save_pretrained('$R/init-random')
tok.save_pretrained('$R/init-random')"

# Downstream: sentence pairs (MRPC, RTE, STS-B) and single sentences (SST-2, its first 10,000 training
# sentences), 3 seeds each, the default rate; two fine-tunings at a time, one thread each.
mkdir -p "$R/glue"
finetune() {  # finetune INIT TASK [THREADS]
  local init=$1 task=$2 out="$R/glue/${1%%/*}-$2" res="" extra=""
  [ -f "$out/report.json" ] && return 0
  [ -f "$out/.bertkit-run.json" ] && res="--resume"
  [ "$task" = sst2 ] && extra="--max-train-samples 10000"
  OMP_NUM_THREADS=${3:-1} $BK finetune glue --task "$task" --data-dir "$G" --model-name-or-path "$R/$init" \
    --output-dir "$out" --seed 1,2,3 --no-progress $extra $res > "$out.json" 2> "$out.log" || echo "failed: $out"
}
export -f finetune; export R G BK
for task in ${TASKS:-sst2 stsb mrpc rte}; do
  for init in pt-random/final pt-nearby/final init-random; do echo "$init $task"; done
done | xargs -P 2 -L 1 bash -c 'finetune "$0" "$1"'

# Continued: does more pre-training lift the random arm off the context-free plateau? Its final model trains
# LONGER_STEPS more steps at 128 tokens (its own warm-up and decay, both cores), then is scored and
# fine-tuned on STS-B and SST-2 like the arms (LONGER_STEPS=0 skips this).
LONGER_STEPS=${LONGER_STEPS:-3000}
if [ "$LONGER_STEPS" -gt 0 ]; then
  pretrain_run "$R/pt-random-longer" --data "$R/data-random" --init-from "$R/pt-random/final" \
    --max-steps "$LONGER_STEPS" --learning-rate 5e-4 --seed 43 --save-steps 500 --eval-steps 500
  heldout "$R/heldout-longer.jsonl" "$R/pt-random-longer/final"
  for task in sst2 stsb; do finetune pt-random-longer/final "$task" 2; done
fi
echo ALL-DONE
