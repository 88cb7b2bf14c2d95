"""The same global batch gives the same model at any process count and accumulation, on real variable-length data.

Token-level losses (masked LM, tagging) are divided by the labelled tokens of the whole optimiser step, not
averaged per micro-batch: with pre-training instances from WikiText-2 (the default 10% short sequences) and
CoNLL-2003 sentences, the micro-batches of a step hold different numbers of targets, and a mean of per-micro-batch
means would weight them unequally. 1 x 32, 1 x 16 x accumulation 2 and 2 processes x 16 must end within 1e-5
after 10 steps.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from token_loss_helpers import STEPS, run_spawned, run_training

TOL = 1e-5


def _max_diff(a: dict, b: dict) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


@pytest.fixture(scope="module")
def real_examples(tmp_path_factory, minilm_2_layers, data_dir) -> dict:
    """320 pre-training instances from WikiText-2 valid and 320 CoNLL-2003 train sentences, saved for the workers."""
    from bertkit.data.dataset import PretrainingDataset
    from bertkit.data.pretraining import create_pretraining_data
    from bertkit.tasks.ner import featurize_ner, label_list, read_conll
    from bertkit.tokenization import BertTokenizer

    root = tmp_path_factory.mktemp("token-loss")
    tok = BertTokenizer.from_pretrained(minilm_2_layers)  # 8,960 word pieces: vocabulary-sized logits 3.4x smaller
    with open(data_dir / "corpus/wikitext-2/wiki.valid.raw", encoding="utf-8", newline="") as f:
        (root / "wiki.raw").write_text(f.read(150_000), encoding="utf-8", newline="")  # the first articles, as they are
    create_pretraining_data([root / "wiki.raw"], tok, root / "instances", max_seq_length=64, max_predictions_per_seq=10,
                            dupe_factor=1, num_workers=0, progress=False, seed=11)  # default short_seq_prob 0.1
    ds = PretrainingDataset(root / "instances")
    assert len(ds) >= 320, len(ds)
    pretrain = [ds[i] for i in range(320)]
    sentences = read_conll(data_dir / "conll2003/train.txt")[:320]
    labels = label_list(sentences)
    ner = featurize_ner(sentences, tok, labels, max_seq_length=64)[:320]
    files = {"pretrain": root / "pretrain.pt", "ner": root / "ner.pt"}
    torch.save(pretrain, files["pretrain"])
    torch.save(ner, files["ner"])
    return {"root": root, "files": files, "vocab_size": len(tok), "num_labels": len(labels),
            "examples": {"pretrain": pretrain, "ner": ner}}


def _job(real: dict, task: str, name: str, global_batch: int, accum: int) -> dict:
    return dict(task=task, data_file=str(real["files"][task]), out_dir=str(real["root"] / f"{task}-{name}"),
                global_batch=global_batch, accum=accum, vocab_size=real["vocab_size"], num_labels=real["num_labels"])


class _Runs(dict):
    """{(task, split): run}, each trained at its first use: make test reads the one-process runs only, so it spawns
    no processes (the two-process runs, both tasks in one group of two, come with make test-slow's cases)."""

    def __init__(self, real: dict):
        super().__init__()
        self.real = real

    def __missing__(self, key):
        task, split = key
        torch.set_num_threads(1)
        if split == "2x16":
            jobs = [_job(self.real, t, "2x16", 32, 1) for t in ("pretrain", "ner")]
            self["pretrain", "2x16"], self["ner", "2x16"] = run_spawned(2, str(self.real["root"] / "two.pt"), jobs)
        else:
            self[key] = run_training(**_job(self.real, task, split, 32, {"1x32": 1, "1x16x2": 2}[split]))
        return self[key]


@pytest.fixture(scope="module")
def runs(real_examples) -> dict:
    return _Runs(real_examples)


@pytest.mark.parametrize("task", ["pretrain", "ner"])
def test_the_halves_of_real_batches_hold_different_target_counts(real_examples, task):
    """What makes the test below mean something: a mean of per-half means would not be the batch's mean."""
    from bertkit.training.batch_plan import BatchPlan

    examples = real_examples["examples"][task]
    plan = BatchPlan(examples, 32, lambda b: b, seed=3)
    unequal = 0
    for chunk in plan.global_batches(0)[:STEPS]:
        counts = [sum(int((torch.as_tensor(examples[i]["labels"]) != -100).sum()) for i in half)
                  for half in (chunk[:16], chunk[16:])]
        unequal += counts[0] != counts[1]
    assert unequal >= STEPS // 2


# accumulation in make test; two processes in make test-slow (two ranks against one process, the masked-LM loss among
# them, are make test's in test_distributed.py::test_two_ranks_equal_one_process)
@pytest.mark.parametrize(("task", "split"), [(t, s) if s == "1x16x2" else pytest.param(t, s, marks=pytest.mark.slow)
                                             for t in ("pretrain", "ner") for s in ("1x16x2", "2x16")])
def test_a_split_global_batch_trains_the_same_model(runs, task, split):
    whole, other = runs[task, "1x32"]["weights"], runs[task, split]["weights"]
    assert _max_diff(whole, other) <= TOL  # a mean of per-micro-batch means: 1.4e-2 (pre-training), 6.7e-3 (NER)
    logged = [[r["loss"] for r in runs[task, s]["history"] if r["split"] == "train"] for s in ("1x32", split)]
    assert len(logged[1]) == STEPS
    if task == "ner":  # the logged loss is the step's token mean too (it was the mean of the halves' means: 2.2141)
        np.testing.assert_allclose(logged[1], logged[0], rtol=1e-5)


def test_the_weights_moved(runs):
    """The comparison is between trained models, not two untouched initialisations."""
    from bertkit.heads import BertForTokenClassification
    from token_loss_helpers import tiny_config

    torch.manual_seed(0)
    init = BertForTokenClassification(tiny_config(runs["ner", "1x32"]["weights"]["bert.embeddings.word_embeddings.weight"].shape[0],
                                                  runs["ner", "1x32"]["weights"]["classifier.bias"].shape[0]))
    assert _max_diff(init.state_dict(), runs["ner", "1x32"]["weights"]) > 1e-3
