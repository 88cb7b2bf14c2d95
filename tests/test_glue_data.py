"""GLUE readers, metrics, featurization, collate and submission files.

Real-data tests read glue/ under the shared data folder (conftest `data_dir`; row and label counts from
its README). The four tasks that are not there (QQP, MNLI, QNLI, WNLI) and the diagnostic set are
tested on small files written here in the exact GLUE layout.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from bertkit.data.collate import collate
from bertkit.tasks import glue, metrics
from bertkit.tokenization import BertTokenizer


@pytest.fixture(scope="module")
def tok(minilm_dir):
    """bertkit's own tokenizer on the example checkpoint's vocabulary (uncased)."""
    return BertTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def glue_dir(data_dir):
    path = data_dir / "glue"
    if not path.is_dir():
        pytest.skip(f"shared data absent at {path}")
    return path


# ---------------------------------------------------------------- metrics vs sklearn / scipy


@pytest.mark.parametrize("seed", range(5))
def test_classification_metrics_match_sklearn_on_random_predictions(seed):
    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(seed)
    n = int(rng.integers(5, 400))
    y, p = rng.integers(0, 2, n), rng.integers(0, 2, n)
    assert metrics.accuracy(y, p) == pytest.approx(sk.accuracy_score(y, p), abs=1e-15)
    assert metrics.f1_binary(y, p) == pytest.approx(sk.f1_score(y, p), abs=1e-15)
    assert metrics.matthews_corrcoef(y, p) == pytest.approx(sk.matthews_corrcoef(y, p), abs=1e-12)
    y3, p3 = rng.integers(0, 3, n), rng.integers(0, 3, n)  # MNLI-sized label set
    assert metrics.matthews_corrcoef(y3, p3) == pytest.approx(sk.matthews_corrcoef(y3, p3), abs=1e-12)


@pytest.mark.parametrize(
    "y, p",
    [
        ([0, 1, 1, 0, 1], [1, 1, 1, 1, 1]),  # constant prediction
        ([0, 0, 0, 0], [0, 1, 0, 1]),  # constant truth
        ([0, 0, 0], [0, 0, 0]),  # no positives anywhere
        ([1, 0, 1, 0], [1, 0, 1, 0]),  # perfect
        ([1, 0, 1, 0], [0, 1, 0, 1]),  # perfectly wrong
        ([1], [1]),
    ],
)
def test_classification_metrics_edge_cases_match_sklearn(y, p):
    sk = pytest.importorskip("sklearn.metrics")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sklearn warns about 0/0 precision and recall
        assert metrics.f1_binary(y, p) == sk.f1_score(y, p, zero_division=0.0)
        assert metrics.matthews_corrcoef(y, p) == pytest.approx(sk.matthews_corrcoef(y, p), abs=1e-15)
    assert metrics.accuracy(y, p) == sk.accuracy_score(y, p)


@pytest.mark.parametrize(
    "y, p, message",
    [
        ([0, 1, 2, 1], [0, 1, 1, 2], r"needs two classes, got 3 \(\[0, 1, 2\]\); use f1_macro"),  # sklearn: multiclass
        ([2, 3, 2], [3, 3, 2], r"positive class 1 is not one of the labels \[2, 3\]"),  # sklearn: not a valid label
    ],
)
def test_binary_f1_is_refused_where_sklearn_refuses_it(y, p, message):
    # the F1 of class 1 against the rest (0.5 and 0.0 here) is a number no reference gives for these labels
    with pytest.raises(ValueError, match=message):
        metrics.f1_binary(y, p)
    assert metrics.f1_binary([2, 2], [2, 2]) == 0.0  # one class only: sklearn's 0.0 (with its warning)


@pytest.mark.parametrize("seed", range(5))
def test_macro_f1_matches_sklearn_on_random_multiclass_predictions(seed):
    sk = pytest.importorskip("sklearn.metrics")
    rng = np.random.default_rng(seed)
    n, k = int(rng.integers(5, 400)), 3 + seed % 3
    y, p = rng.integers(0, k, n), rng.integers(0, k, n)
    assert metrics.f1_macro(y, p) == pytest.approx(sk.f1_score(y, p, average="macro"), abs=1e-15)
    p_skewed = np.where(rng.random(n) < 0.8, 0, p)  # a model stuck near the majority class
    assert metrics.f1_macro(y, p_skewed) == pytest.approx(sk.f1_score(y, p_skewed, average="macro"), abs=1e-15)


@pytest.mark.parametrize(
    "y, p, expected",
    [
        # per class: 0 -> 2*1/(2*1+1+1) = 1/2, 1 -> 2/(2+1) = 2/3, 2 -> 4/(4+1) = 4/5
        ([0, 0, 1, 2, 2, 2], [0, 1, 1, 2, 2, 0], (1 / 2 + 2 / 3 + 4 / 5) / 3),
        ([0, 0, 1, 1], [0, 0, 1, 1], 1.0),
        ([0, 1, 2], [1, 2, 0], 0.0),
        ([0, 0, 3, 3], [0, 2, 3, 3], (2 / 3 + 0 + 1) / 3),  # class 2 only predicted; 1 nowhere: left out
    ],
)
def test_macro_f1_by_hand_and_like_sklearn(y, p, expected):
    assert metrics.f1_macro(y, p) == pytest.approx(expected, abs=1e-15)
    sk = pytest.importorskip("sklearn.metrics")
    assert metrics.f1_macro(y, p) == pytest.approx(sk.f1_score(y, p, average="macro", zero_division=0.0), abs=1e-15)


def test_constant_predictions_give_mcc_zero_and_perfect_gives_one():
    assert metrics.matthews_corrcoef([0, 1, 1, 0], [1, 1, 1, 1]) == 0.0
    assert metrics.matthews_corrcoef([0, 1, 1, 0], [0, 1, 1, 0]) == 1.0
    assert metrics.matthews_corrcoef([0, 1, 1, 0], [1, 0, 0, 1]) == -1.0


@pytest.mark.parametrize("seed", range(5))
def test_correlations_match_scipy_including_ties(seed):
    stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(seed)
    n = int(rng.integers(3, 300))
    gold = rng.integers(0, 6, n).astype(float)  # many ties, like STS-B's 0..5 scores
    pred = gold + rng.normal(0, 1.5, n)
    assert metrics.pearson(pred, gold) == pytest.approx(stats.pearsonr(pred, gold)[0], abs=1e-12)
    assert metrics.spearman(pred, gold) == pytest.approx(stats.spearmanr(pred, gold)[0], abs=1e-12)
    rounded = np.round(pred)  # ties on both sides
    assert metrics.spearman(rounded, gold) == pytest.approx(stats.spearmanr(rounded, gold)[0], abs=1e-12)
    np.testing.assert_array_equal(metrics.rankdata(rounded), stats.rankdata(rounded))


def test_correlations_of_constant_input_are_nan_like_scipy():
    assert np.isnan(metrics.pearson([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]))
    assert np.isnan(metrics.spearman([1.0, 2.0, 3.0], [4.0, 4.0, 4.0]))
    assert metrics.pearson([1, 2, 3], [2, 4, 6]) == pytest.approx(1.0)
    assert metrics.spearman([1, 2, 3], [30, 20, 10]) == pytest.approx(-1.0)


@pytest.mark.parametrize("scale", [1e-200, 1.0, 1e200])
def test_pearson_of_very_large_or_small_values_is_scipys(scale):
    # scipy.stats.pearsonr([1, 2, 4], [0, 1, 2]) = 0.98198..., at any scale of the first input
    assert metrics.pearson(np.array([1.0, 2.0, 4.0]) * scale, [0, 1, 2]) == pytest.approx(0.9819805060619656, rel=1e-12)


def test_metric_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="3 values but y_pred has 2"):
        metrics.accuracy([0, 1, 1], [0, 1])


def test_labels_as_strings_against_indices_are_an_error_as_in_sklearn():
    # "1" never equals 1: accuracy came out 0.0 where it is 2/3 (sklearn: "Mix of label input types")
    for score in (metrics.accuracy, metrics.f1_binary, metrics.matthews_corrcoef):
        with pytest.raises(ValueError, match=r"y_true holds strings \(\['0', '1'\], ...\) and y_pred numbers"):
            score(["1", "0", "1"], [1, 0, 0])
    with pytest.raises(ValueError, match=r"y_pred holds strings \(\['0', '1'\], ...\) and y_true numbers"):
        metrics.accuracy([1, 0, 0], ["1", "0", "1"])
    with pytest.raises(ValueError, match=r"y_true holds strings"):  # an object array, as a pandas column gives
        metrics.accuracy(np.array(["1", "0", "1"], dtype=object), [1, 0, 0])
    assert metrics.accuracy(["1", "0", "1"], ["1", "0", "0"]) == pytest.approx(2 / 3)  # names on both sides
    assert metrics.accuracy([1.0, 0.0, True], [1, 0, 0]) == pytest.approx(2 / 3)  # numbers of any kind, as sklearn


def test_task_metrics_have_the_glue_keys():
    assert glue.get_task("cola").metric(np.asarray([1, 1, 1]), np.asarray([0, 1, 1])) == {"mcc": 0.0}
    mrpc = glue.get_task("mrpc").metric(np.asarray([1, 0, 1, 1]), np.asarray([1, 0, 0, 1]))
    assert mrpc == {"f1": pytest.approx(0.8), "accuracy": 0.75}
    assert set(glue.get_task("sts-b").metric(np.asarray([0.1, 2.0, 4.0]), np.asarray([0.0, 2.5, 5.0]))) == {"pearson", "spearman"}
    assert glue.get_task("rte").metric(np.asarray([0, 1]), np.asarray([0, 0])) == {"accuracy": 0.5}


# ---------------------------------------------------------------- registry


def test_label_order_matches_a_checkpoints_names_in_any_order_and_case():
    mnli = glue.get_task("mnli")  # contradiction, entailment, neutral
    assert mnli.label_order({0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"}) == [0, 2, 1]  # roberta-large-mnli
    assert mnli.label_order({0: "entailment", 1: "neutral", 2: "contradiction"}) == [2, 0, 1]
    assert mnli.label_order({0: "LABEL_0", 1: "LABEL_1", 2: "LABEL_2"}) is None
    users = dataclasses.replace(mnli, labels=("NEG", "POS"))  # finetune classify's labels, read from a user's file
    assert users.label_order({0: "POS", 1: "NEG"}) == users.label_order({0: "pos", 1: "neg"}) == [1, 0]
    cased = dataclasses.replace(mnli, labels=("POS", "pos"))  # two classes that differ only in case
    assert cased.label_order({0: "pos", 1: "POS"}) == [1, 0]
    assert cased.label_order({0: "Pos", 1: "POS"}) is None


def test_registry_covers_the_nine_tasks_plus_mismatched_and_diagnostic():
    assert set(glue.GLUE_TASKS) == {
        "cola",
        "sst-2",
        "mrpc",
        "sts-b",
        "qqp",
        "mnli",
        "mnli-mm",
        "qnli",
        "rte",
        "wnli",
        "ax",
    }
    assert glue.get_task("SST-2") is glue.get_task("sst2") is glue.GLUE_TASKS["sst-2"]
    assert glue.get_task("MNLI").files["dev"] == "dev_matched.tsv"
    assert glue.get_task("mnli-mm").files["test"] == "test_mismatched.tsv"
    assert glue.get_task("stsb").is_regression and glue.get_task("stsb").num_labels == 1
    assert glue.get_task("mnli").labels == ("contradiction", "entailment", "neutral")
    assert [glue.GLUE_TASKS[n].submission_file for n in ("sst-2", "mnli", "mnli-mm", "ax")] == [
        "SST-2.tsv",
        "MNLI-m.tsv",
        "MNLI-mm.tsv",
        "AX.tsv",
    ]
    with pytest.raises(ValueError, match="unknown GLUE task 'squad'"):
        glue.get_task("squad")


# ---------------------------------------------------------------- real files

REAL = [
    # task, split, rows, (first id, text_a, text_b, label), (last id, text_a, text_b, label)
    ("cola", "train", 8551,
     ("0", "Our friends won't buy this analysis, let alone the next one we propose.", None, "1"),
     ("8550", "What all did you get for Christmas?", None, "1")),
    ("cola", "dev", 1043,
     ("0", "The sailors rode the breeze clear of the rocks.", None, "1"),
     ("1042", "John talked to Bill about himself.", None, "1")),
    ("cola", "test", 1063,
     ("0", "Bill whistled past the house.", None, None),
     ("1062", "A picture of himself frightened John.", None, None)),
    ("sst-2", "train", 67349,
     ("0", "hide new secretions from the parental units ", None, "0"),
     ("67348", "this new jangle of noise , mayhem and stupidity must be a serious contender for the title . ", None, "0")),
    ("sst-2", "dev", 872,
     ("0", "it 's a charming and often affecting journey . ", None, "1"), None),
    ("sst-2", "test", 1821, ("0", "uneasy mishmash of styles and genres .", None, None), None),
    ("mrpc", "train", 3668,
     ("0", 'Amrozi accused his brother , whom he called " the witness " , of deliberately distorting his evidence .',
      'Referring to him as only " the witness " , Amrozi accused his brother of deliberately distorting his evidence .', "1"),
     None),
    ("mrpc", "dev", 408, None, None),
    ("mrpc", "test", 1725, None, None),
    ("sts-b", "train", 5749,
     ("0", "A plane is taking off.", "An air plane is taking off.", "5.000"),
     ("5748", "Putin spokesman: Doping charges appear unfounded",
      "The Latest on Severe Weather: 1 Dead in Texas After Tornado", "0")),
    ("sts-b", "dev", 1500, ("0", "A man with a hard hat is dancing.", "A man wearing a hard hat is dancing.", "5.000"), None),
    ("sts-b", "test", 1379,
     None, ("1378", "South Korea declares end to MERS outbreak", "North Korea Delegation Meets With South Korean Officials", None)),
    ("rte", "train", 2490,
     ("0", "No Weapons of Mass Destruction Found in Iraq Yet.", "Weapons of Mass Destruction Found in Iraq.", "not_entailment"),
     None),
    ("rte", "dev", 277, None, None),
    ("rte", "test", 3000, None, ("2999", None, "26 people died in an airplane crash.", None)),
]  # fmt: skip

LABEL_COUNTS = {  # from the data README
    ("cola", "train"): {"1": 6023, "0": 2528},
    ("cola", "dev"): {"1": 721, "0": 322},
    ("sst-2", "train"): {"1": 37569, "0": 29780},
    ("sst-2", "dev"): {"1": 444, "0": 428},
    ("mrpc", "train"): {"1": 2474, "0": 1194},
    ("mrpc", "dev"): {"1": 279, "0": 129},
    ("rte", "train"): {"entailment": 1249, "not_entailment": 1241},
    ("rte", "dev"): {"entailment": 146, "not_entailment": 131},
}


def _check_row(ex, want):
    if want is None:
        return
    for field, value in zip(("id", "text_a", "text_b", "label"), want, strict=True):
        if value is not None or field == "label":
            assert getattr(ex, field) == value, field


@pytest.mark.parametrize("task, split, rows, first, last", REAL, ids=[f"{r[0]}-{r[1]}" for r in REAL])
def test_real_glue_files(task, split, rows, first, last, glue_dir):
    examples = glue.read_glue(task, glue_dir, split)
    assert len(examples) == rows
    _check_row(examples[0], first)
    _check_row(examples[-1], last)
    t = glue.get_task(task)
    if split == "test":
        assert all(e.label is None for e in examples)
        assert [e.id for e in examples] == [str(i) for i in range(rows)]  # GLUE test indices are 0..n-1
    elif t.is_regression:
        scores = [float(e.label) for e in examples]
        assert min(scores) == 0.0 and max(scores) == 5.0
    else:
        counts = {lab: sum(e.label == lab for e in examples) for lab in t.labels}
        assert counts == LABEL_COUNTS[(task, split)]
    assert all(e.text_a for e in examples)
    assert all("\ufeff" not in e.text_a and "\t" not in e.text_a for e in examples)


def test_mrpc_header_bom_is_not_part_of_the_data(glue_dir):
    raw = (glue_dir / "MRPC" / "train.tsv").read_bytes()
    assert raw.startswith(b"\xef\xbb\xbfQuality")
    examples = glue.read_glue("mrpc", glue_dir, "train")
    assert examples[0].line == 2 and examples[0].label == "1"


# ---------------------------------------------------------------- tasks missing from the shared data


def _write(path: Path, lines: list[str], bom: bool = False) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(("\ufeff" if bom else "") + "\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_qqp_layout(tmp_path):
    _write(tmp_path / "QQP" / "train.tsv", [
        "id\tqid1\tqid2\tquestion1\tquestion2\tis_duplicate",
        "133273\t213221\t213222\tHow is the life of a math student? Could you describe your own experiences?\t"
        "Which level of prepration is enough for the exam jlpt5?\t0",
        '402555\t536040\t536041\tHow do I control my horny emotions?\tHow do you control your horniness?\t1',
    ])  # fmt: skip
    _write(tmp_path / "QQP" / "test.tsv", [
        "id\tquestion1\tquestion2",
        "0\tWhy am I mentally very lonely? How can I solve it?\tFind the remainder when [math]23^{24}[/math] is divided by 24,23?",
    ])  # fmt: skip
    train = glue.read_glue("qqp", tmp_path, "train")
    assert [(e.id, e.label) for e in train] == [("133273", "0"), ("402555", "1")]
    assert train[1].text_a == "How do I control my horny emotions?"
    assert train[1].text_b == "How do you control your horniness?"
    (test,) = glue.read_glue("qqp", tmp_path, "test")
    assert test.id == "0" and test.label is None and test.text_b.startswith("Find the remainder")


def _mnli_row(index: str, s1: str, s2: str, labels: list[str]) -> str:
    parse = "( x )"
    return "\t".join([index, "31193", "31193n", "government", parse, parse, parse, parse, s1, s2, *labels])


def test_mnli_matched_and_mismatched_layouts(tmp_path, tok):
    head = "index\tpromptID\tpairID\tgenre\tsentence1_binary_parse\tsentence2_binary_parse\tsentence1_parse\tsentence2_parse\tsentence1\tsentence2"
    _write(tmp_path / "MNLI" / "train.tsv", [
        head + "\tlabel1\tgold_label",
        _mnli_row("0", "Conceptually cream skimming has two basic dimensions - product and geography.",
                  "Product and geography are what make cream skimming work. ", ["neutral", "neutral"]),
        _mnli_row("1", "you know during the season and i guess at at your level uh you lose them",
                  "You lose the things to the following level if the people recall.", ["entailment", "entailment"]),
    ])  # fmt: skip
    five = ["neutral", "entailment", "neutral", "neutral", "neutral"]
    _write(tmp_path / "MNLI" / "dev_matched.tsv", [
        head + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label",
        _mnli_row("0", "The new rights are nice enough", "Everyone really likes the newest benefits ", [*five, "neutral"]),
    ])  # fmt: skip
    _write(tmp_path / "MNLI" / "dev_mismatched.tsv", [
        head + "\tlabel1\tlabel2\tlabel3\tlabel4\tlabel5\tgold_label",
        _mnli_row("0", "Your contribution helped make it possible", "Your contributions were of no help",
                  ["contradiction"] * 6),
    ])  # fmt: skip
    _write(
        tmp_path / "MNLI" / "test_matched.tsv",
        [head, _mnli_row("0", "Hierbas, ans seco", "Hierbas is a name", [])],
    )
    _write(
        tmp_path / "MNLI" / "test_mismatched.tsv",
        [head, _mnli_row("7", "What's truly striking", "Sight", [])],
    )

    train = glue.read_glue("mnli", tmp_path, "train")
    assert [e.label for e in train] == ["neutral", "entailment"]
    assert train[0].text_b == "Product and geography are what make cream skimming work. "
    assert glue.featurize(train, tok, 64, "mnli")[1]["labels"] == 1
    (dev_m,) = glue.read_glue("mnli", tmp_path, "dev")
    assert dev_m.label == "neutral" and dev_m.text_a == "The new rights are nice enough"
    (dev_mm,) = glue.read_glue("mnli-mm", tmp_path, "dev")
    assert dev_mm.label == "contradiction"
    assert glue.read_glue("mnli-mm", tmp_path, "train") == train  # one training file for both
    (test_mm,) = glue.read_glue("mnli-mm", tmp_path, "test")
    assert (test_mm.id, test_mm.text_a, test_mm.label) == ("7", "What's truly striking", None)


@pytest.mark.parametrize(
    "task, cols, label",
    [("qnli", ("question", "sentence"), "not_entailment"), ("wnli", ("sentence1", "sentence2"), "1")],
)
def test_qnli_and_wnli_layouts(tmp_path, task, cols, label):
    t = glue.get_task(task)
    _write(
        tmp_path / t.data_dir / "dev.tsv",
        [f"index\t{cols[0]}\t{cols[1]}\tlabel", f"0\tFirst text.\tSecond text.\t{label}"],
    )
    _write(tmp_path / t.data_dir / "test.tsv", [f"index\t{cols[0]}\t{cols[1]}", "0\tA.\tB.", "1\tC.\tD."])
    (dev,) = glue.read_glue(task, tmp_path, "dev")
    assert (dev.id, dev.text_a, dev.text_b, dev.label) == ("0", "First text.", "Second text.", label)
    assert [(e.id, e.text_b, e.label) for e in glue.read_glue(task, tmp_path, "test")] == [
        ("0", "B.", None),
        ("1", "D.", None),
    ]
    assert t.text_columns == cols


def test_diagnostic_is_test_only(tmp_path):
    _write(
        tmp_path / "diagnostic" / "diagnostic.tsv",
        ["index\tsentence1\tsentence2", "0\tThe cat sat.\tThe cat did not sit."],
    )
    (ax,) = glue.read_glue("ax", tmp_path, "test")
    assert ax.text_b == "The cat did not sit." and ax.label is None
    with pytest.raises(ValueError, match="no split 'train'"):
        glue.read_glue("ax", tmp_path, "train")


def test_headerless_file_with_bom_keeps_its_first_row(tmp_path):
    path = _write(
        tmp_path / "cola.tsv", ["gj04\t1\t\tThe sailors rode the breeze.", "gj04\t0\t*\tThe more."], bom=True
    )
    examples = glue.get_task("cola").read(path, labeled=True)
    assert [(e.label, e.text_a) for e in examples] == [
        ("1", "The sailors rode the breeze."),
        ("0", "The more."),
    ]


def test_crlf_files_and_quotes_are_read_verbatim(tmp_path):
    path = tmp_path / "dev.tsv"
    path.write_bytes(b'sentence\tlabel\r\nhe said " hi \t1\r\n')
    (ex,) = glue.get_task("sst-2").read(path, labeled=True)
    assert ex.text_a == 'he said " hi ' and ex.label == "1"


# ---------------------------------------------------------------- user errors


def test_malformed_row_names_file_line_and_counts(tmp_path):
    path = _write(tmp_path / "RTE" / "train.tsv", [
        "index\tsentence1\tsentence2\tlabel", "0\tA.\tB.\tentailment", "1\tA sentence without its pair\tentailment",
    ])  # fmt: skip
    with pytest.raises(ValueError) as err:
        glue.read_glue("rte", tmp_path, "train")
    msg = str(err.value)
    assert f"malformed row in {path} line 3: expected 4 tab-separated columns for rte, got 3" in msg


def test_unknown_label_and_bad_score_are_errors(tmp_path):
    path = _write(tmp_path / "rte.tsv", ["index\tsentence1\tsentence2\tlabel", "0\tA.\tB.\tcontradiction"])
    with pytest.raises(ValueError, match=r"rte\.tsv line 2: label 'contradiction' is not one of"):
        glue.get_task("rte").read(path, labeled=True)
    header = "index\tgenre\tfilename\tyear\told_index\tsource1\tsource2\tsentence1\tsentence2\tscore"
    path = _write(tmp_path / "sts.tsv", [header, "0\tg\tf\ty\t0\tn\tn\tA.\tB.\tfive"])
    with pytest.raises(ValueError, match=r"sts\.tsv line 2: sts-b score 'five' is not a number"):
        glue.get_task("sts-b").read(path, labeled=True)


def test_test_file_read_as_labeled_and_missing_file(tmp_path):
    path = _write(tmp_path / "t.tsv", ["index\tsentence1\tsentence2", "0\tA.\tB."])
    with pytest.raises(ValueError, match="line 2: expected 4 tab-separated columns for rte, got 3"):
        glue.get_task("rte").read(path, labeled=True)
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "WNLI" / "train.tsv")):
        glue.read_glue("wnli", tmp_path, "train")


# ---------------------------------------------------------------- featurize / collate


def test_featurize_pairs_is_unpadded_with_segments_and_label_indices(tok):
    ex = [
        glue.GlueExample("0", "The cat sat on the mat.", "A cat sat.", "entailment", 2),
        glue.GlueExample("1", "Dogs bark.", "Cats fly over the moon tonight.", "not_entailment", 3),
    ]
    feats = glue.featurize(ex, tok, 128, "rte")
    for f, e in zip(feats, ex, strict=True):
        a, b = tok.tokenize(e.text_a), tok.tokenize(e.text_b)
        want = [
            tok.cls_token_id,
            *tok.convert_tokens_to_ids(a),
            tok.sep_token_id,
            *tok.convert_tokens_to_ids(b),
            tok.sep_token_id,
        ]
        assert f["input_ids"] == want
        assert f["token_type_ids"] == [0] * (len(a) + 2) + [1] * (len(b) + 1)
        assert f["attention_mask"] == [1] * len(want)
    assert [f["labels"] for f in feats] == [0, 1]
    assert len(feats[0]["input_ids"]) != len(feats[1]["input_ids"])  # no padding


def test_featurize_truncates_longest_first(tok):
    long_a = " ".join(["alpha"] * 30)
    ex = [glue.GlueExample("0", long_a, "beta gamma", "0", 2)]
    (f,) = glue.featurize(ex, tok, 16, "mrpc")
    assert len(f["input_ids"]) == 16
    # The short segment survives whole; the long one is cut to fit: 16 - 3 specials - 2 = 11 tokens.
    assert f["token_type_ids"].count(1) == 3 and f["input_ids"][1:12] == tok.convert_tokens_to_ids(
        ["alpha"] * 11
    )
    with pytest.raises(ValueError, match="max_seq_length 3 leaves no room"):
        glue.featurize(ex, tok, 3, "mrpc")


def test_featurize_regression_and_unlabeled(tok):
    (f,) = glue.featurize([glue.GlueExample("0", "A man.", "A woman.", "3.800", 2)], tok, 32, "sts-b")
    assert f["labels"] == pytest.approx(3.8) and isinstance(f["labels"], float)
    (f,) = glue.featurize([glue.GlueExample("0", "uneasy mishmash .", None, None, 2)], tok, 32, "sst-2")
    assert "labels" not in f and f["token_type_ids"] == [0] * len(f["input_ids"])


def test_collate_pads_to_batch_max_with_the_pad_id():
    feats = [
        {"input_ids": [101, 7, 102], "token_type_ids": [0, 0, 0], "attention_mask": [1, 1, 1], "labels": 1},
        {
            "input_ids": [101, 102],
            "token_type_ids": [0, 0],
            "attention_mask": [1, 1],
            "labels": 0,
            "meta": "x",
        },
    ]
    batch = collate(feats, pad_token_id=5)
    assert set(batch) == {"input_ids", "token_type_ids", "attention_mask", "labels"}
    assert batch["input_ids"].tolist() == [[101, 7, 102], [101, 102, 5]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 1, 0]]
    assert batch["token_type_ids"].tolist() == [[0, 0, 0], [0, 0, 0]]
    assert batch["labels"].dtype == torch.long and batch["labels"].tolist() == [1, 0]
    reg = collate(
        [{"input_ids": [1], "labels": 0.5}, {"input_ids": [1, 2], "labels": 4.0}], pad_token_id=0
    )
    assert reg["labels"].dtype == torch.float32 and reg["labels"].tolist() == [0.5, 4.0]
    with pytest.raises(ValueError, match="do not mix labeled and unlabeled"):
        collate([{"input_ids": [1], "labels": 1}, {"input_ids": [1]}], pad_token_id=0)


def test_real_featurize_then_collate_round_trip(tok, glue_dir):
    ex = glue.read_glue("mrpc", glue_dir, "dev")[:16]
    feats = glue.featurize(ex, tok, 128, "mrpc")
    batch = collate(feats, tok.pad_token_id)
    lengths = [len(f["input_ids"]) for f in feats]
    assert batch["input_ids"].shape == (16, max(lengths))
    assert batch["attention_mask"].sum(1).tolist() == lengths
    assert batch["labels"].tolist() == [int(e.label) for e in ex]


# ---------------------------------------------------------------- submission files


def test_write_submission_label_names_and_scores(tmp_path):
    out = glue.write_submission("rte", np.array([0, 1, 1]), ["0", "1", "2"], tmp_path)
    assert out == tmp_path / "RTE.tsv"
    assert out.read_text() == "index\tprediction\n0\tentailment\n1\tnot_entailment\n2\tnot_entailment\n"
    out = glue.write_submission("sts-b", [0.12345, 4.9996], ["10", "11"], tmp_path / "custom.tsv")
    assert out.read_text() == "index\tprediction\n10\t0.123\n11\t5.000\n"
    out = glue.write_submission("sts-b", [-0.2, 5.7], ["0", "1"], tmp_path / "unclipped.tsv")  # as run_glue.py
    assert out.read_text() == "index\tprediction\n0\t-0.200\n1\t5.700\n"
    assert glue.write_submission("mnli-mm", [2], ["0"], tmp_path).name == "MNLI-mm.tsv"
    assert (tmp_path / "MNLI-mm.tsv").read_text().splitlines()[1] == "0\tneutral"
    with pytest.raises(ValueError, match="2 predictions but 1 ids"):
        glue.write_submission("cola", [0, 1], ["0"], tmp_path)
    with pytest.raises(ValueError, match="class index in 0..1"):
        glue.write_submission("cola", [2], ["0"], tmp_path)


def test_submission_ids_come_from_the_test_file(tmp_path, glue_dir):
    test = glue.read_glue("rte", glue_dir, "test")
    out = glue.write_submission("rte", [0] * len(test), [e.id for e in test], tmp_path)
    lines = out.read_text().splitlines()
    assert len(lines) == 3001 and lines[0] == "index\tprediction" and lines[-1] == "2999\tentailment"


def test_ax_has_no_training_split_and_says_how_it_is_predicted(tmp_path):
    with pytest.raises(ValueError, match=r"GLUE ax has no split 'train'; it has \['test'\]; AX is predicted with a "
                                         r"model fine-tuned on MNLI: bertkit finetune glue --task mnli"):
        glue.read_glue("ax", tmp_path, "train")
