#!/usr/bin/env bash
# BERT pre-trained from scratch in about an hour of a 2-core CPU: learn an 8,192-entry vocabulary, make
# masked-LM instances (dynamic masking), pre-train the shape in config.json with the settings in
# pretrain.json, and score the result on held-out text beside the floor a context-free predictor reaches.
#
#   examples/pretrain-1h/run.sh [CORPUS_DIR] [OUT_DIR] [PRETRAIN_ARGS...]   (from the repository root;
#                                                                           make pretrain-1h)
#
# PRETRAIN_ARGS go to `bertkit pretrain` after the recipe's settings, so they override them: `--nsp` adds
# next-sentence prediction with random negatives (what it cost and gave at this budget: RESULTS.md, "The NSP
# question"). Give such a run its own OUT_DIR: a resumed run must keep the settings it started
# with.
# CORPUS_DIR holds plain-text documents (*.txt, *.md; default ../shared/data/corpus: books and Wikipedia
# articles, with WikiText-2 valid as held-out text when present). Run it again to continue after a stop:
# every step skips what is done and the pre-training resumes from its last checkpoint.
# Why these settings: RESULTS.md, "Pre-training from scratch on a CPU budget".
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
C=${1:-../shared/data/corpus}
R=${2:-runs/pretrain-1h}
EXTRA=("${@:3}")
BK=${BK:-.venv/bin/bertkit}
PY=${PY:-.venv/bin/python}
mapfile -t TEXT < <(find "$C" -type f \( -name '*.txt' -o -name '*.md' \) -not -path '*wikitext*' | sort)
[ ${#TEXT[@]} -gt 0 ] || { echo "no *.txt or *.md documents under $C" >&2; exit 2; }
HELDOUT=$C/wikitext-2/wiki.valid.raw
mkdir -p "$R"
[ -f "$R/vocab/vocab.txt" ] || $BK train-tokenizer "${TEXT[@]}" --vocab-size 8192 --output-dir "$R/vocab" --no-progress
[ -f "$R/data/manifest.json" ] || $BK create-pretraining-data "${TEXT[@]}" --vocab "$R/vocab" --output-dir "$R/data" \
    --max-seq-length 128 --dupe-factor 1 --masking dynamic --no-progress --overwrite
EVAL=()
if [ -f "$HELDOUT" ]; then
  [ -f "$R/heldout/manifest.json" ] || $BK create-pretraining-data "$HELDOUT" --vocab "$R/vocab" \
      --output-dir "$R/heldout" --max-seq-length 128 --dupe-factor 1 --no-progress --overwrite
  EVAL=(--eval-data "$R/heldout" --eval-steps 1000)  # 2,000 held-out instances a time (--eval-instances)
fi
# A run cut short before it finished left its files in bertkit's staging directory beside the model's
# (.model.bertkit-staging): continued from its last checkpoint, or started again when it wrote none.
STAGED=$R/.model.bertkit-staging
RESUME=()
if [ -d "$R/model/checkpoints" ] || [ -d "$STAGED/checkpoints" ]; then RESUME=(--resume)
elif [ -d "$R/model" ] || [ -d "$STAGED" ]; then RESUME=(--overwrite); fi
[ -f "$R/model/final/config.json" ] || $BK pretrain --config "$HERE/pretrain.json" --config-name "$HERE/config.json" \
    --data "$R/data" --vocab "$R/vocab" --output-dir "$R/model" "${EVAL[@]}" "${RESUME[@]}" "${EXTRA[@]}"
if [ -f "$HELDOUT" ]; then
  $PY "$HERE/../../experiments/pretrain_eval.py" --model "$R/model/final" --data "$R/heldout" \
      --baseline "$R/data" --vocab "$R/vocab"
fi
