"""Shared fixtures: where the real checkpoint and the shared data live (with clear skips when absent), the tiny
pre-training inputs, and the factories of tiny random models and checkpoints (``tiny_model``, ``tiny_checkpoint``)."""

from __future__ import annotations

import gc
import getpass
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[1]

# Under pytest-xdist (`make test`: two workers) each worker takes its share of the cores: two workers with
# torch's default of one thread per core would oversubscribe them, and OpenMP threads waiting on each other
# turn a 2 s test into 40 s. The environment variable reaches the processes the tests start (CLI, torchrun).
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    _threads = str(max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])))
    os.environ["OMP_NUM_THREADS"] = _threads
    os.environ["MKL_NUM_THREADS"] = _threads

# An emulated narrower CPU (ATEN_CPU_CAPABILITY=avx2, BENCHMARKS.md) compiles into an Inductor cache of its own:
# Inductor's cache key leaves the capability out, so the default cache serves kernels built for the unlimited CPU,
# which computed wrong values under it (compiled models' logits, int8's per-token activation ranges; PyTorch 2.13).
# The variable reaches the processes the tests start.
if os.environ.get("ATEN_CPU_CAPABILITY"):
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(
        tempfile.gettempdir(), f"torchinductor_{getpass.getuser()}_{os.environ['ATEN_CPU_CAPABILITY'].lower()}"))

DATA = Path(os.environ.get("BERTKIT_DATA", REPO.parent / "shared" / "data"))

# The files whose tests take longest (`pytest --durations=0`, summed per file: about a third of the suite's worker
# time), run first, longest first. `make test` hands whole files to its two workers in collection order
# (`--dist loadfile`), so a long file collected last leaves one worker running it alone at the end; started first,
# the short files fill in around them. Within a file the order is unchanged.
_LONGEST_FILES = ("test_sentence_calls.py", "test_sentence_trainer.py", "test_cross_encoder.py",
                  "test_sentence_ddp_save.py", "test_tokenizer_parity.py", "test_sentence_model.py",
                  "test_transformers_compat.py", "test_sparse_serve.py", "test_tokenizer_json.py", "test_serve.py",
                  "test_sentence_losses.py", "test_pretrain_resume.py", "test_export.py", "test_int8_switch.py")


def pytest_configure(config):
    # pytest-xdist (3.x) hands out files with the most tests first unless told not to (--loadscope-reorder, its
    # default), which would undo the order above: a 2-test file of 60 s would wait behind every 20-case file.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    rank = {name: i for i, name in enumerate(_LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: the rest keep their order


def pytest_collection_finish(session):
    # What collection imported (torch, transformers, sentence-transformers, datasets: half a million objects) lives
    # as long as the process, and every full garbage collection scanned it again, 0.25-0.5 s each: the automatic
    # ones, and one at the end of every transformers Trainer.train() (accelerate's release_memory), 6.9 s of
    # test_trainer_contract.py's 22. Frozen, it is left out of every later collection.
    gc.collect()
    gc.freeze()
    # A full collection still scans every object made since (the tests' models, tokenizers, fixtures and what later
    # imports bring): 80-90 per worker at Python's default thresholds, 0.3 s each, 24-31 s of a worker's time in
    # `make test`. Each tenth collection of the middle generation triggered one; each hundredth does now. Young
    # garbage goes as before; older cyclic garbage waits longer.
    gc.set_threshold(*gc.get_threshold()[:2], 100)


@pytest.fixture(scope="session", autouse=True)
def datasets_map_skips_fingerprinting():
    """datasets fingerprints each ``map`` by pickling its function with dill, the tokenizer it closes over included
    (90 ms for transformers' tokenizer; 6 s of test_trainer_contract.py's and test_trainer.py's reference runs).
    The fingerprint only names cache files; the tests' datasets live in memory and none reads one, so each map gets
    a random fingerprint, as datasets gives a function it cannot hash. bertkit reads its own digest of the rows."""
    fingerprint = sys.modules.get("datasets.fingerprint")
    if fingerprint is None:
        yield
        return
    arrow = sys.modules["datasets.arrow_dataset"]
    real = fingerprint.update_fingerprint

    def update_fingerprint(fingerprint_, transform, transform_args):
        return fingerprint.generate_random_fingerprint()

    fingerprint.update_fingerprint = arrow.update_fingerprint = update_fingerprint
    yield
    fingerprint.update_fingerprint = arrow.update_fingerprint = real


@pytest.fixture(scope="session", autouse=True)
def no_accelerator_cache_to_release():
    """transformers' Trainer ends each ``train()`` with accelerate's ``release_memory``, a full garbage collection
    for an accelerator's cache: 0.5-1 s each once the tests' objects have piled up, 73 runs (about 40 s). No test has
    an accelerator, and none reads what a collection frees, so the reference Trainer skips it."""
    memory = sys.modules.get("accelerate.utils.memory")
    if memory is None:
        yield
        return
    real = memory.clear_device_cache
    memory.clear_device_cache = lambda garbage_collection=False: None
    yield
    memory.clear_device_cache = real


@pytest.fixture(scope="session", autouse=True)
def http_clients_share_one_tls_context():
    """``httpx.get``/``post`` (the tests' requests to ``bertkit serve``, the clients' libraries) make a client each,
    and each client loaded certifi's CA bundle into a new TLS context: 85 ms a request, 38 s over 443 requests, for
    URLs that are all plain http on localhost. The default context is made once and shared."""
    transports = sys.modules.get("httpx._transports.default")
    if transports is None:
        yield
        return
    real = transports.create_ssl_context
    shared = []

    def create_ssl_context(verify=True, cert=None, trust_env=True):
        if verify is not True or cert is not None:
            return real(verify=verify, cert=cert, trust_env=trust_env)
        if not shared:
            shared.append(real(verify=verify, cert=cert, trust_env=trust_env))
        return shared[0]

    transports.create_ssl_context = create_ssl_context
    yield
    transports.create_ssl_context = real


@pytest.fixture(scope="session", autouse=True)
def fsync_checks_its_descriptor_only():
    """``os.fsync`` in this process checks its descriptor (EBADF as the real call) and returns, leaving the page cache
    as it is. bertkit fsyncs each file it writes and its directory before the rename (outputs.py): about 7 ms a call on
    this machine's virtual disk, 781 calls (5.3 s of 64 s) in test_sentence_trainer.py alone. No test here can see a
    flush (a process killed by a test leaves the page cache as it is, and the killed processes are separate ones,
    where fsync is real); a test that makes fsync fail patches ``os.fsync`` itself."""
    real = os.fsync

    def fsync(fd) -> None:
        os.fstat(fd if isinstance(fd, int) else fd.fileno())

    os.fsync = fsync
    yield
    os.fsync = real


@pytest.fixture(autouse=True)
def int8s_compile_is_each_tests_own():
    """Each test finds int8's compiled activation quantization as a new process has it: not compiled, not due. A
    server's warm-up (``compile_next``) left it due in the worker, and whichever test next ran an int8 model on 256K
    activations paid Inductor's compile (3-15 s; 13.5 of test_every_head_runs_quantized[BertForMaskedLM]'s 13.5 s
    in one `make test`, 0.5 s without). The tests of the compile build their own ``_Compiled`` or stand in for it."""
    kernels = sys.modules.get("bertkit.quantization.kernels")
    if kernels is not None:
        fused = kernels.compiled_quantize_per_token
        fused.__init__(fused.fn)
    yield


def model_dir() -> Path:
    return Path(os.environ.get("BERTKIT_TEST_MODEL", REPO / "models" / "minilm")).resolve()


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    d = model_dir()
    if not (d / "config.json").is_file():
        pytest.skip(f"real checkpoint absent at {d}: run `make model` (bertkit download-example-model {d})")
    return d


# minilm_2_layers keeps MiniLM's first ids (specials, [unused], characters, then words by frequency) and every "##"
# character piece, so any text still tokenizes without [UNK]: 8,960 of 30,522 entries, 23% more pieces on SQuAD
# paragraphs. The embedding rows are most of a 2-layer MiniLM (11.7M of 15.4M parameters) and a checkpoint writes
# them three times (weights, Adam's two moments): the training tests' files shrink 2.2x and a SPLADE head's
# vocabulary-sized logits 3.4x.
_KEPT_IDS_BELOW = 8000


@pytest.fixture(scope="session")
def minilm_2_layers(minilm_dir, tmp_path_factory) -> Path:
    """MiniLM cut to its first 2 of 6 layers and to 8,960 entries of its vocabulary (its ids below 8,000 unchanged,
    the "##" character pieces renumbered after them; the embedding rows, tokenizer files and pooler cut to match):
    real weights on real text at a fraction of the cost, for the checks whose property does not depend on depth or
    vocabulary (a gather, a parity of the code path, a training loop); a check of MiniLM's own numbers takes
    ``minilm_dir``."""
    from safetensors.torch import load_file, save_file

    out = tmp_path_factory.mktemp("minilm-2-layers")
    vocab = (minilm_dir / "vocab.txt").read_text(encoding="utf-8").splitlines()
    kept = [i for i, token in enumerate(vocab) if i < _KEPT_IDS_BELOW or (token.startswith("##") and len(token) == 3)]
    config = json.loads((minilm_dir / "config.json").read_text())
    config.update(num_hidden_layers=2, vocab_size=len(kept))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    weights = {k: v for k, v in load_file(minilm_dir / "model.safetensors").items()
               if "encoder.layer." not in k or int(k.split("encoder.layer.")[1].split(".")[0]) < 2}
    for key in [k for k in weights if k.endswith("word_embeddings.weight")]:
        weights[key] = weights[key][kept].contiguous()
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})
    tokens = [vocab[i] for i in kept]
    (out / "vocab.txt").write_text("\n".join(tokens) + "\n", encoding="utf-8")
    fast = json.loads((minilm_dir / "tokenizer.json").read_text(encoding="utf-8"))
    fast["model"]["vocab"] = {token: i for i, token in enumerate(tokens)}  # the specials' ids are below 8,000
    (out / "tokenizer.json").write_text(json.dumps(fast), encoding="utf-8")
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(minilm_dir / name, out / name)
    return out

@pytest.fixture(scope="session")
def seeded_classifier(tmp_path_factory, minilm_2_layers) -> Path:
    """MiniLM's first 2 layers with a seeded two-label head (negative, positive): its predictions are arbitrary but
    fixed, enough to compare the paths a prediction takes (files, resumes, the pipeline)."""
    import torch

    from bertkit.heads import BertForSequenceClassification
    from bertkit.tokenization import BertTokenizer

    out = tmp_path_factory.mktemp("clf")
    torch.manual_seed(0)
    BertForSequenceClassification.from_pretrained(minilm_2_layers, id2label={0: "negative", 1: "positive"}
                                                  ).save_pretrained(out)
    BertTokenizer.from_pretrained(minilm_2_layers).save_pretrained(out)
    return out


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

    A test that changes any of it copies it to its own ``tmp_path`` first. Under pytest-xdist the workers share one
    copy in the run's directory above theirs: the first to need it builds it (1.8 s of CPU) under a lock, the others
    wait for it and read it.
    """
    import fcntl

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's, shared: each worker's own is popen-gwN inside it
    root = base / "tiny-pretraining"
    with open(base / "tiny-pretraining.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / "built").is_file():
            shutil.rmtree(root, ignore_errors=True)  # a worker's build cut short
            _build_tiny_pretraining_data(root)
            (root / "built").touch()
    return root


def _build_tiny_pretraining_data(root: Path) -> None:
    from bertkit.data.pretraining import create_pretraining_data
    from bertkit.demo import build_corpus
    from bertkit.tokenization import BertTokenizer
    from bertkit.tokenization.trainer import train_wordpiece_vocab

    build_corpus(root / "corpus")
    vocab = train_wordpiece_vocab([root / "corpus" / "train.txt"], vocab_size=1500, num_workers=1, progress=False)
    tok = BertTokenizer(vocab)
    tok.save_pretrained(root / "vocab")
    create_pretraining_data([root / "corpus" / "train.txt"], tok, root / "data", max_seq_length=32,
                            max_predictions_per_seq=5, dupe_factor=1, input_format="sentences", seed=3,
                            num_workers=1, progress=False)


# The tiny shape most tests use (2 layers, 32 wide); a test overrides any field through the factories' keywords.
TINY_CONFIG = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
                   max_position_embeddings=128)
TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.json")


def _tiny_model(head: str | type = "BertModel", *, seed: int | None = 0, labels: list[str] | int | None = None,
                **config: Any):
    """A random bertkit model of ``head`` (a class or a name exported by bertkit) on ``TINY_CONFIG`` updated with
    ``config``. ``torch.manual_seed(seed)`` comes right before the weights are drawn, so the weights are those of
    ``torch.manual_seed(seed); head(BertConfig(...))``: a test that asserts numbers keeps them by passing its seed
    and config. ``seed=None`` draws from the generator as it stands (a second model after a first); ``labels``
    goes through ``BertConfig.with_labels``."""
    import torch

    import bertkit
    from bertkit import BertConfig

    cls = getattr(bertkit, head) if isinstance(head, str) else head
    cfg = BertConfig(**{**TINY_CONFIG, **config})
    if labels is not None:
        cfg = cfg.with_labels(labels)
    if seed is not None:
        torch.manual_seed(seed)
    return cls(cfg)


def _tiny_checkpoint(directory: str | os.PathLike, head: str | type = "BertModel", *, tokenizer: Any = None,
                     seed: int | None = 0, labels: list[str] | int | None = None, **config: Any) -> Path:
    """``_tiny_model(head, seed=..., labels=..., **config)`` saved in ``directory`` with its tokenizer; returns
    ``directory``. ``tokenizer`` is a ``BertTokenizer`` (saved beside the weights), a list of tokens (made into
    one), or the directory of a checkpoint whose tokenizer files are copied as they are (MiniLM's). Without
    ``vocab_size``, the model's vocabulary is the tokenizer's."""
    from bertkit import BertTokenizer

    directory = Path(directory)
    files_from = Path(tokenizer) if isinstance(tokenizer, (str, os.PathLike)) else None
    if isinstance(tokenizer, (list, tuple)):
        tokenizer = BertTokenizer({t: i for i, t in enumerate(tokenizer)})
    elif files_from is not None:
        tokenizer = BertTokenizer.from_pretrained(files_from)
    if tokenizer is not None:
        config.setdefault("vocab_size", len(tokenizer))
    _tiny_model(head, seed=seed, labels=labels, **config).save_pretrained(directory)
    if files_from is not None:  # as they are (tokenizer.json included), not as bertkit would write them
        for name in TOKENIZER_FILES:
            if (files_from / name).is_file():
                shutil.copy(files_from / name, directory / name)
    elif tokenizer is not None:
        tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="session")
def tiny_model():
    """The factory ``tiny_model(head="BertModel", *, seed=0, labels=None, **config)`` of tiny random models."""
    return _tiny_model


@pytest.fixture(scope="session")
def tiny_checkpoint():
    """The factory ``tiny_checkpoint(directory, head="BertModel", *, tokenizer=None, seed=0, labels=None,
    **config)`` of tiny random checkpoints on disk (returns ``directory``)."""
    return _tiny_checkpoint




# a word-level vocabulary for command-line tests over short film reviews ("a good film", "fine films")
FILM_WORDS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good", "bad", "film", "dull", "fine", "##s"]


@pytest.fixture(scope="session")
def film_classifier(tmp_path_factory) -> Path:
    """A tiny neg/pos BertForSequenceClassification checkpoint over ``FILM_WORDS`` (128 positions: 40 words of
    "films" are 81 pieces), for the command-line tests that run ``bertkit predict`` and ``finetune`` on it."""
    return _tiny_checkpoint(tmp_path_factory.mktemp("film") / "clf", "BertForSequenceClassification",
                            tokenizer=FILM_WORDS, labels=["neg", "pos"], num_attention_heads=2,
                            max_position_embeddings=128)


@pytest.fixture
def one_thread():
    """One thread for the test: bit-exact comparisons, and parity checks whose numbers are ill-conditioned enough that
    the split of a GEMM over threads shows (the killed-run tests set OMP_NUM_THREADS=1 for the same reason)."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
