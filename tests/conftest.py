"""Shared fixtures: where the real checkpoint and the shared data live, and clear skips when absent."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Under pytest-xdist (`make test`: two workers) each worker takes its share of the cores: two workers with
# torch's default of one thread per core would oversubscribe them, and OpenMP threads waiting on each other
# turn a 2 s test into 40 s. The environment variable reaches the processes the tests start (CLI, torchrun).
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    _threads = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    os.environ["OMP_NUM_THREADS"] = _threads
    os.environ["MKL_NUM_THREADS"] = _threads
DATA = Path(os.environ.get("BERTKIT_DATA", REPO.parent / "shared" / "data"))


def model_dir() -> Path:
    return Path(os.environ.get("BERTKIT_TEST_MODEL", REPO / "models" / "minilm")).resolve()


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    d = model_dir()
    if not (d / "config.json").is_file():
        pytest.skip(f"real checkpoint absent at {d}: run `make model` (bertkit download-example-model {d})")
    return d


@pytest.fixture(scope="session")
def data_dir() -> Path:
    if not DATA.is_dir():
        pytest.skip(f"shared data absent at {DATA}: these checks need ../shared/data beside the repo")
    return DATA


@pytest.fixture(scope="session")
def tiny_pretraining_data(tmp_path_factory) -> Path:
    """Pre-training inputs built once per run, read-only for the tests that share them:

    - ``corpus/train.txt``, ``corpus/heldout.txt``: Python's own documentation (present on every machine) in
      google's format, from ``bertkit.demo.build_corpus``;
    - ``vocab/``: a 1,500-entry WordPiece vocabulary learned from ``train.txt``;
    - ``data/``: ``train.txt`` made into 32-token instances (5 predictions each, dupe factor 1, seed 3).

    A test that changes any of it copies it to its own ``tmp_path`` first.
    """
    from bertkit.data.pretraining import create_pretraining_data
    from bertkit.demo import build_corpus
    from bertkit.tokenization import BertTokenizer
    from bertkit.tokenization.trainer import save_vocab, train_wordpiece_vocab

    root = tmp_path_factory.mktemp("tiny-pretraining")
    build_corpus(root / "corpus")
    vocab = train_wordpiece_vocab([root / "corpus" / "train.txt"], vocab_size=1500, num_workers=1, progress=False)
    tok = BertTokenizer.from_pretrained(save_vocab(vocab, root / "vocab"))
    create_pretraining_data([root / "corpus" / "train.txt"], tok, root / "data", max_seq_length=32,
                            max_predictions_per_seq=5, dupe_factor=1, input_format="sentences", seed=3,
                            num_workers=1, progress=False)
    return root
