# The README's commands. Every target creates .venv and installs what it needs on first use.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
MODEL   ?= models/minilm
PIP     := $(BIN)/pip install -q -c constraints.txt

.PHONY: demo test test-slow bench lint model clean pretrain-1h splade

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(PIP) torch==2.13.0
	$(PIP) -e ".[test,plot,onnx,tensorboard,serve]"
	touch $(STAMP)

# TensorFlow and sentence-transformers (large) only for the slow reference checks.
$(VENV)/.references: $(STAMP)
	$(PIP) -e ".[test-references]"
	touch $@

$(MODEL)/config.json: | $(STAMP)
	$(BIN)/bertkit download-example-model $(MODEL)

model: $(MODEL)/config.json

demo: $(STAMP) $(MODEL)/config.json
	$(BIN)/bertkit demo --model $(MODEL) --out runs/demo --overwrite

# BERT pre-trained from scratch in about an hour of both cores (examples/pretrain-1h; resumable: run it again).
CORPUS  ?= ../shared/data/corpus
pretrain-1h: $(STAMP)
	examples/pretrain-1h/run.sh $(CORPUS) runs/pretrain-1h

# SPLADE trained from that pre-trained model on SQuAD, against BM25 and dense embedders, then served
# (examples/splade; resumable: run it again).
splade: $(STAMP) $(MODEL)/config.json
	$(BIN)/python examples/splade/splade_squad.py --model runs/pretrain-1h/model/final --miner $(MODEL) \
	    --out runs/splade --serve

# Two pytest workers (pytest-xdist), a test file each at a time, so a file's module fixtures are built once:
# most tests wait on Python, process start-up and files, not on both cores. TEST_WORKERS=0 runs in one process.
# Bytecode is cached even where the environment says not to (PYTHONDONTWRITEBYTECODE=1, as in many containers):
# pytest rewrites the asserts of every test module in every worker, 9 s of each worker's CPU uncached, 0 once cached
# in tests/__pycache__ (ignored by git).
TEST_WORKERS ?= 2
test: $(STAMP) $(MODEL)/config.json
	BERTKIT_TEST_MODEL=$(MODEL) PYTHONDONTWRITEBYTECODE= $(BIN)/pytest -q -m "not slow" -n $(TEST_WORKERS) --dist loadfile

test-slow: $(STAMP) $(VENV)/.references $(MODEL)/config.json
	BERTKIT_TEST_MODEL=$(MODEL) $(BIN)/pytest -q -m slow
	BERTKIT_TEST_MODEL=$(MODEL) BERTKIT_FUZZ_TOKENIZER=100000 BERTKIT_FUZZ_READERS=10000 $(BIN)/pytest -q tests/test_fuzz.py

bench: $(STAMP) $(MODEL)/config.json
	$(BIN)/python bench/bench_inference.py --model $(MODEL)
	$(BIN)/python bench/bench_tokenizer.py --model $(MODEL)

lint: $(STAMP)
	$(BIN)/ruff check src tests bench examples

clean:
	rm -rf $(VENV) runs build *.egg-info src/*.egg-info
