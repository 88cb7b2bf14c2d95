#!/usr/bin/env bash
# The CPU-budget pre-training study of RESULTS.md ("Pre-training from scratch on a CPU budget"), in one
# resumable script:
#   1. the levers, one arm each, on a 1,500-step schedule (batch 32, one thread per arm, two arms at a time);
#   2. the recipe they point to, for an hour of both cores (examples/pretrain-1h/run.sh);
#   3. that model against the same network from random initialisation on MRPC, RTE, STS-B and SST-2
#      (3 seeds each); 4. the same at higher fine-tuning rates; 5. the recipe's model with 2,000 more steps
#      of NSP; 6. 10 epochs of fine-tuning on STS-B and MRPC;
#   7. the levers of shape, sequence length, batch, schedule, peak rate and vocabulary at a fixed budget
#      (the sequences the recipe's model reads in 2,750 steps of 32, converted by each arm's measured cost);
#   8. MRPC at more fine-tuning settings (batch 16; lr 2e-3), the same grid for both initialisations;
#   9. the 128 -> 512 phase on the recipe's model: held-out masked LM at 512 and 128 tokens before and after.
# The NSP arms from scratch (random, nearby and mixed negatives) ran at commit 4403231, the last with
# create-pretraining-data --nsp-negatives: git show 4403231:experiments/pretraining_budget.sh, steps 6, 11-13.
#   R=runs/pretraining-budget experiments/pretraining_budget.sh     (from the repository root)
#   python experiments/pretraining_budget_tables.py --runs runs/pretraining-budget --figures docs/img
# Run it again to continue: every step skips what is done and resumes what was cut.
set -euo pipefail
R=${R:-runs/pretraining-budget}
BK=".venv/bin/python -m bertkit"
PY=".venv/bin/python"
C=${CORPUS:-../shared/data/corpus}
G=${GLUE:-../shared/data/glue}
TEXT=("$C"/gutenberg/*.txt "$C"/wikipedia/*.md)
HELDOUT="$C/wikitext-2/wiki.valid.raw"
mkdir -p "$R/cfg" "$R/arms"

# Vocabularies, instances (dynamic masking: fresh masks every epoch) and held-out instances.
for V in 8192 16384 30522; do
  [ -f "$R/vocab-$V/vocab.txt" ] || $BK train-tokenizer "${TEXT[@]}" --vocab-size $V --output-dir "$R/vocab-$V" --no-progress
done
make_data() {  # make_data OUT VOCAB ARGS...
  local out=$1 v=$2; shift 2
  [ -f "$R/$out/manifest.json" ] || $BK create-pretraining-data --vocab "$R/vocab-$v" --output-dir "$R/$out" \
      --dupe-factor 1 --no-progress --overwrite "$@" > "$R/$out.json"
}
make_data data-8192-128 8192 "${TEXT[@]}" --max-seq-length 128 --masking dynamic
make_data data-8192-128-m30 8192 "${TEXT[@]}" --max-seq-length 128 --masking dynamic --masked-lm-prob 0.3 \
    --max-predictions-per-seq 40
make_data data-30522-128 30522 "${TEXT[@]}" --max-seq-length 128 --masking dynamic
make_data data-16384-128 16384 "${TEXT[@]}" --max-seq-length 128 --masking dynamic
make_data data-8192-64 8192 "${TEXT[@]}" --max-seq-length 64 --masking dynamic
make_data eval-8192-128 8192 "$HELDOUT" --max-seq-length 128
make_data eval-8192-64 8192 "$HELDOUT" --max-seq-length 64
make_data data-8192-512 8192 "${TEXT[@]}" --max-seq-length 512 --max-predictions-per-seq 80 --masking dynamic
make_data eval-8192-512 8192 "$HELDOUT" --max-seq-length 512 --max-predictions-per-seq 80
make_data eval-16384-128 16384 "$HELDOUT" --max-seq-length 128
make_data eval-30522-128 30522 "$HELDOUT" --max-seq-length 128
# The floor: what a predictor that reads no context scores on each held-out set.
if [ ! -s "$R/floors.jsonl" ]; then
  for V in 8192 16384 30522; do
    $PY experiments/pretrain_eval.py --data "$R/eval-$V-128" --baseline "$R/data-$V-128" --vocab "$R/vocab-$V"
  done | $PY -c "import json,sys,os; [print(json.dumps({**r, 'data': os.path.basename(r['data'])})) for r in map(json.loads, sys.stdin)]" \
      > "$R/floors.jsonl"
fi

# 1. The arms. Each changes one or two levers from an earlier arm (arms.json says which); all share the data
# order (seed 42), the schedule shape (5% warm-up, linear decay over 1,500 steps) and the held-out set, so
# arms compare at equal steps.
for drop in 0.1 0.0; do
  if [ $drop = 0.0 ]; then name=tiny-nodrop; else name=tiny; fi
  [ -f "$R/cfg/$name.json" ] || echo "{\"num_hidden_layers\": 2, \"hidden_size\": 128, \"num_attention_heads\": 2,
    \"intermediate_size\": 512, \"hidden_dropout_prob\": $drop, \"attention_probs_dropout_prob\": $drop}" > "$R/cfg/$name.json"
done
cat > "$R/arms.json" <<'EOF'
[{"name": "A-base", "lever": "start: BERT-tiny (L2 H128), 8,192-entry vocabulary, dropout 0.1, NSP, 15% masking, lr 1e-3", "batch": 32, "eval": "eval-8192-128"},
 {"name": "B-nodrop", "lever": "A, dropout off", "batch": 32, "eval": "eval-8192-128"},
 {"name": "C-m30-nonsp-lr2e-3", "lever": "B, no NSP, 30% masking, lr 2e-3", "batch": 32, "eval": "eval-8192-128"},
 {"name": "D-nonsp-lr2e-3", "lever": "B, no NSP, lr 2e-3", "batch": 32, "eval": "eval-8192-128"},
 {"name": "E-nonsp-lr2e-3-unigram", "lever": "D, output bias initialised to the unigram log-prior", "batch": 32, "eval": "eval-8192-128"},
 {"name": "F-nonsp-lr2e-3-unigram-sinpos", "lever": "E, sinusoidal position initialisation", "batch": 32, "eval": "eval-8192-128"}]
EOF
arm() {  # arm NAME CFG LR DATA PRETRAIN_ARGS...: start, resume or skip one arm (one thread)
  local name=$1 cfg=$2 lr=$3 data=$4 out="$R/arms/$1" res=""; shift 4
  [ -f "$out/final/config.json" ] && return 0
  [ -d "$out" ] && res="--overwrite"
  [ -d "$out/checkpoints" ] && res="--resume"
  OMP_NUM_THREADS=1 $BK pretrain --data "$R/$data" --vocab "$R/vocab-8192" --config-name "$R/cfg/$cfg.json" \
    --output-dir "$out" --max-steps 1500 --batch-size 32 --logging-steps 50 --learning-rate "$lr" --warmup-ratio 0.05 \
    --eval-data "$R/eval-8192-128" --eval-steps 100 --eval-instances 1000 --save-steps 500 --seed 42 --no-progress \
    $res "$@" > "$out.json" 2>> "$out.log"
}
arm A-base tiny 1e-3 data-8192-128 & arm B-nodrop tiny-nodrop 1e-3 data-8192-128 & wait
arm C-m30-nonsp-lr2e-3 tiny-nodrop 2e-3 data-8192-128-m30 --no-nsp & arm D-nonsp-lr2e-3 tiny-nodrop 2e-3 data-8192-128 --no-nsp & wait
arm E-nonsp-lr2e-3-unigram tiny-nodrop 2e-3 data-8192-128 --no-nsp --mlm-bias-init unigram &
arm F-nonsp-lr2e-3-unigram-sinpos tiny-nodrop 2e-3 data-8192-128 --no-nsp --mlm-bias-init unigram --position-init sinusoidal &
wait

# 2. The recipe, on both cores (the vocabulary, instances and held-out set it makes equal those above).
examples/pretrain-1h/run.sh "$C" "$R/pretrain-1h" | tee "$R/pretrain-1h.scores.jsonl"

# 3. Downstream. Both networks fine-tune with dropout 0.1 (the paper's; pre-training ran without it), the default
# rate for this width (1e-4), 3 epochs, batch 32, seeds 1-3; SST-2 on its first 10,000 training sentences.
finetune_copy() {  # finetune_copy SRC DST: the model with the paper's dropout for fine-tuning
  [ -f "$2/config.json" ] && return 0
  mkdir -p "$2" && cp "$1"/* "$2"/ 2>/dev/null || true
  $PY -c "
import json,sys; p=sys.argv[1]+'/config.json'; c=json.load(open(p))
c.update(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1); json.dump(c, open(p,'w'), indent=2)" "$2"
}
finetune_copy "$R/pretrain-1h/model/final" "$R/init-pretrained"
if [ ! -f "$R/init-random/config.json" ]; then
  $PY -c "
import sys, torch
from bertkit.config import BertConfig
from bertkit.heads import BertForMaskedLM
from bertkit.tokenization import BertTokenizer
torch.manual_seed(42)
src, dst = sys.argv[1], sys.argv[2]
BertForMaskedLM(BertConfig.from_json_file(src + '/config.json')).save_pretrained(dst)
BertTokenizer.from_pretrained(src).save_pretrained(dst)" "$R/init-pretrained" "$R/init-random"
fi
finetune() {  # finetune DIR INIT TASK [LR [EPOCHS [BATCH]]]: fine-tune INIT on TASK into $R/DIR (LR: the rate or a grid)
  local out="$R/$1/$2-$3" res="" extra=""
  [ -f "$out/report.json" ] && return 0
  [ -f "$out/.bertkit-run.json" ] && res="--resume"
  [ "$3" = sst2 ] && extra="--max-train-samples 10000"
  [ -n "${4:-}" ] && extra="$extra --learning-rate $4"
  [ -n "${5:-}" ] && extra="$extra --num-train-epochs $5"
  [ -n "${6:-}" ] && extra="$extra --batch-size $6"
  mkdir -p "$R/$1"
  OMP_NUM_THREADS=1 $BK finetune glue --task "$3" --data-dir "$G" --model-name-or-path "$R/$2" \
    --output-dir "$out" --seed 1,2,3 --no-progress $extra $res > "$out.json" 2> "$out.log" || echo "failed: $out"
}
export -f finetune; export R G BK
for task in mrpc rte stsb sst2; do
  for init in init-pretrained init-random; do echo "$init $task"; done
done | xargs -P 2 -L 1 bash -c 'finetune glue "$0" "$1"'

# 4. The fine-tuning rate: 1e-4 left both networks near the majority class on MRPC and STS-B, so both run
# again at 3e-4 and 1e-3 (Turc et al. 2019 searched up to 3e-4 for their BERT-tiny), 3 seeds each.
for task in mrpc stsb rte sst2; do
  for init in init-pretrained init-random; do echo "$init $task"; done
done | xargs -P 2 -L 1 bash -c 'finetune glue-lr "$0" "$1" 3e-4,1e-3'

# 5. Whether the untrained [CLS] / pooler is what fails downstream: the recipe's model pre-trained 2,000 more
# steps with next-sentence prediction on (random negatives; the masked LM continues beside it), then
# fine-tuned as in step 4.
P1H="$R/pretrain-1h"
if [ ! -f "$R/nsp-cont/final/config.json" ]; then
  res=(); [ -d "$R/nsp-cont/checkpoints" ] && res=(--resume); [ -d "$R/nsp-cont" ] && [ ${#res[@]} = 0 ] && res=(--overwrite)
  $BK pretrain --init-from "$P1H/model/final" --data "$P1H/data" --vocab "$P1H/vocab" \
    --config-name examples/pretrain-1h/config.json --nsp --max-steps 2000 --batch-size 32 --learning-rate 5e-4 \
    --warmup-ratio 0.1 --eval-data "$P1H/heldout" --eval-steps 1000 --eval-instances 2000 --save-steps 500 \
    --seed 43 --no-progress --output-dir "$R/nsp-cont" "${res[@]}" > "$R/nsp-cont.json" 2> "$R/nsp-cont.log"
fi
finetune_copy "$R/nsp-cont/final" "$R/init-nsp-cont"
for task in mrpc stsb rte sst2; do echo "init-nsp-cont $task"; done | xargs -P 2 -L 1 bash -c 'finetune glue-lr "$0" "$1" 3e-4,1e-3'
# 6. Longer fine-tuning on the two tasks that had not moved: 10 epochs at 1e-3, both initialisations.
for task in stsb mrpc; do
  for init in init-pretrained init-random; do echo "$init $task"; done
done | xargs -P 2 -L 1 bash -c 'finetune glue-10ep "$0" "$1" 1e-3 10'
# 7. The levers the first arms left out, at a fixed budget instead of at equal steps: every arm reads what costs
# the recipe's BERT-tiny 2,750 steps of 32 (about 12-15 minutes of one core), its steps scaled by its cost per
# sequence against BERT-tiny's, measured back to back on one idle thread (runs/.../probe2: mini L4 H256 0.17x
# tiny's sequences/s, wide L2 H256 0.37x, 64-token sequences 1.43x, 16,384 entries 0.65x, 30,522 entries 0.47x;
# accumulation to 128 costs the same per sequence; R9's 10% of 128-token steps at batch 64 count at full cost).
# All at the recipe's settings (no NSP, unigram bias,
# sinusoidal positions, 2% warm-up, linear decay, seed 42), one thread each, two arms at a time, evaluated 20
# times on the first 1,000 held-out instances of their own vocabulary (128 tokens, also for the 64-token arm:
# the length the model is for).
for c in mini wide; do
  [ -f "$R/cfg/$c-nodrop.json" ] || echo "{\"num_hidden_layers\": $([ $c = mini ] && echo 4 || echo 2), \"hidden_size\": 256,
    \"num_attention_heads\": 4, \"intermediate_size\": 1024, \"hidden_dropout_prob\": 0.0, \"attention_probs_dropout_prob\": 0.0}" \
    > "$R/cfg/$c-nodrop.json"
done
cat > "$R/levers.json" <<'JSON'
[{"name": "R0-base", "lever": "the recipe's settings: BERT-tiny, 8,192 entries, 128 tokens, batch 32, lr 2e-3, linear decay", "steps": 2750, "vocab": 8192},
 {"name": "R0-base-seed43", "lever": "R0 again with seed 43 (initial weights, data order): the spread between seeds", "steps": 2750, "vocab": 8192},
 {"name": "R0-base-seed44", "lever": "R0 again with seed 44", "steps": 2750, "vocab": 8192},
 {"name": "R1-mini", "lever": "shape: BERT-mini (L4 H256 A4)", "steps": 470, "vocab": 8192},
 {"name": "R2-wide", "lever": "shape: wider, as shallow (L2 H256 A4)", "steps": 1000, "vocab": 8192},
 {"name": "R3-seq64", "lever": "64-token instances, batch 64 (the same tokens per step)", "steps": 1970, "vocab": 8192},
 {"name": "R4-b128", "lever": "batch 128 (4 accumulated micro-batches of 32), lr 4e-3", "steps": 690, "vocab": 8192},
 {"name": "R5-cosine", "lever": "cosine decay instead of linear", "steps": 2750, "vocab": 8192},
 {"name": "R6-lr4e-3", "lever": "peak rate 4e-3", "steps": 2750, "vocab": 8192},
 {"name": "R7-vocab16k", "lever": "16,384-entry vocabulary", "steps": 1790, "vocab": 16384},
 {"name": "R8-vocab30k", "lever": "30,522-entry vocabulary (BERT's size)", "steps": 1290, "vocab": 30522},
 {"name": "R3-seq64-seed43", "lever": "R3 again with seed 43", "steps": 1970, "vocab": 8192},
 {"name": "R9-seq64-then-128", "lever": "R3 for 90% of the steps, then 128-token instances (batch 64) for the last 10%", "steps": 1880, "vocab": 8192}]
JSON
lever() {  # lever NAME CFG VOCAB BATCH STEPS LR [PRETRAIN_ARGS...]: start, resume or skip one arm (one thread)
  local out="$R/levers/$1" cfg=$2 v=$3 b=$4 s=$5 lr=$6 data="$R/data-$3-128" res=(); shift 6
  [ -f "$out/final/config.json" ] && return 0
  case "${out##*/}" in
    R3-seq64*) data="$R/data-8192-64" ;;
    R9-seq64-then-128) data="$R/data-8192-64"; set -- "$@" --phase2-data "$R/data-8192-128" --phase1-fraction 0.9 ;;
  esac
  [ -d "$out" ] && res=(--overwrite)
  [ -d "$out/checkpoints" ] && res=(--resume)
  mkdir -p "$R/levers"
  OMP_NUM_THREADS=1 $BK pretrain --data "$data" --vocab "$R/vocab-$v" --config-name "$R/cfg/$cfg.json" \
    --output-dir "$out" --max-steps "$s" --batch-size "$b" --logging-steps 50 --learning-rate "$lr" --warmup-ratio 0.02 \
    --no-nsp --mlm-bias-init unigram --position-init sinusoidal --eval-data "$R/eval-$v-128" --eval-steps $((s / 20)) \
    --eval-instances 1000 --save-steps 250 --seed 42 --no-progress "${res[@]}" "$@" > "$out.json" 2>> "$out.log"
}
export -f lever; export PY
cat <<'ARMS' | xargs -P 2 -L 1 bash -c 'lever "$@"' _
R0-base tiny-nodrop 8192 32 2750 2e-3
R0-base-seed43 tiny-nodrop 8192 32 2750 2e-3 --seed 43
R0-base-seed44 tiny-nodrop 8192 32 2750 2e-3 --seed 44
R1-mini mini-nodrop 8192 32 470 2e-3
R2-wide wide-nodrop 8192 32 1000 2e-3
R3-seq64 tiny-nodrop 8192 64 1970 2e-3
R4-b128 tiny-nodrop 8192 128 690 4e-3 --gradient-accumulation-steps 4
R5-cosine tiny-nodrop 8192 32 2750 2e-3 --lr-scheduler-type cosine
R6-lr4e-3 tiny-nodrop 8192 32 2750 4e-3
R7-vocab16k tiny-nodrop 16384 32 1790 2e-3
R8-vocab30k tiny-nodrop 30522 32 1290 2e-3
R9-seq64-then-128 tiny-nodrop 8192 64 1880 2e-3
R3-seq64-seed43 tiny-nodrop 8192 64 1970 2e-3 --seed 43
ARMS
# 8. MRPC, the one task where the recipe's model was not ahead of random initialisation beyond the seeds'
# spread at each one's best setting: both initialisations at batch 16 (lr 3e-4 and 1e-3) and at lr 2e-3 (batch
# 32), 3 epochs, seeds 1-3, so that each one's best is chosen on the same, wider grid (the paper searches
# batch 16 and 32).
{ for init in init-pretrained init-random; do echo "glue-b16 $init mrpc 3e-4,1e-3 3 16"; echo "glue-lr2e-3 $init mrpc 2e-3 3 32"; done; } \
  | xargs -P 2 -L 1 bash -c 'finetune "$@"' _
# 9. The paper's second phase, at this budget: the recipe's model (128 tokens, an hour) pre-trained 500 more
# steps of 32 on 512-token instances (masked LM alone, lr 5e-4, 10% warm-up, linear decay; positions 128-511
# start from the recipe's sinusoidal table, untrained), then both scored on every 512- and 128-token held-out
# instance.
if [ ! -f "$R/phase512/final/config.json" ]; then
  res=(); [ -d "$R/phase512/checkpoints" ] && res=(--resume); [ -d "$R/phase512" ] && [ ${#res[@]} = 0 ] && res=(--overwrite)
  $BK pretrain --init-from "$P1H/model/final" --data "$R/data-8192-512" --vocab "$P1H/vocab" --no-nsp \
    --max-steps 500 --batch-size 32 --learning-rate 5e-4 --warmup-ratio 0.1 --eval-data "$R/eval-8192-512" \
    --eval-steps 100 --eval-instances 733 --save-steps 100 --seed 44 --no-progress --output-dir "$R/phase512" \
    "${res[@]}" > "$R/phase512.json" 2> "$R/phase512.log"
fi
[ -s "$R/phase512/heldout.jsonl" ] || $PY experiments/pretrain_eval.py --model "$P1H/model/final" "$R/phase512/final" \
    --data "$R/eval-8192-512" "$P1H/heldout" --baseline "$P1H/data" --vocab "$P1H/vocab" > "$R/phase512/heldout.jsonl"
echo ALL-DONE
