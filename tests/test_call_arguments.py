"""Unusual arguments to the public Python API that a randomized comparison with transformers and
sentence-transformers found mishandled (tests/test_argument_fuzz.py keeps the generator): each is refused naming the
value and the fix before any work, with nothing lost, or gives the reference's result."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

import bertkit
from bertkit.errors import BertkitError

WORDS = [
    "[PAD]",
    "[UNK]",
    "[CLS]",
    "[SEP]",
    "[MASK]",
    "john",
    "lives",
    "in",
    "new",
    "york",
    "a",
    "good",
    "film",
    "##s",
]


@pytest.fixture(scope="module")
def encoder_dir(tmp_path_factory, tiny_checkpoint):
    return tiny_checkpoint(tmp_path_factory.mktemp("args") / "enc", tokenizer=WORDS)


@pytest.fixture(scope="module")
def clf_dir(tmp_path_factory, tiny_checkpoint):
    return tiny_checkpoint(
        tmp_path_factory.mktemp("args") / "clf",
        "BertForSequenceClassification",
        tokenizer=WORDS,
        labels=["neg", "pos"],
    )


META = (
    r"^device 'meta': bertkit runs models on cpu, cuda, mps \(a 'meta' device holds no weights, so a model moved "
    r"there would lose them\); use auto, cpu, cuda or cuda:N$"
)


@pytest.mark.parametrize("kind", ["SentenceTransformer", "CrossEncoder", "SparseEncoder"])
def test_a_call_on_the_meta_device_is_refused_and_the_model_keeps_its_weights(
    kind, encoder_dir, clf_dir, tmp_path, tiny_checkpoint
):
    """sentence-transformers' encode(device=...) moves the model for good; device="meta" moved it where tensors hold no
    numbers: that call failed deep in torch ("Cannot copy out of meta tensor") and every later call too, the weights
    gone. device="CPU" was torch's RuntimeError, "cuda" without a GPU an AssertionError. Now refused by name, first."""
    from bertkit import sentence

    if kind == "SentenceTransformer":
        model = sentence.SentenceTransformer(str(encoder_dir))
        call = model.encode
        inputs = ["a good film", "john lives in new york"]
    elif kind == "CrossEncoder":
        model = sentence.CrossEncoder(str(clf_dir))
        call = model.predict
        inputs = [("a good film", "john lives in new york")]
    else:
        mlm = tiny_checkpoint(tmp_path / "mlm", "BertForMaskedLM", tokenizer=WORDS)
        model = sentence.SparseEncoder(str(mlm))
        call = model.encode
        inputs = ["a good film", "john lives in new york"]

    def scores():
        out = call(inputs, convert_to_tensor=True)
        return out.to_dense() if out.is_sparse else out

    before = scores()
    with pytest.raises(BertkitError, match=META):
        call(inputs, device="meta")
    with pytest.raises(BertkitError, match=r"^device 'CPU' is not a device: use auto, cpu, cuda or cuda:N$"):
        call(inputs, device="CPU")
    if not torch.cuda.is_available():
        with pytest.raises(
            BertkitError, match=r"^device 'cuda': PyTorch sees no CUDA GPU here; use cpu \(or auto\)$"
        ):
            call(inputs, device="cuda")
    assert model.device == torch.device("cpu")
    torch.testing.assert_close(scores(), before, rtol=0, atol=0)
    with pytest.raises(BertkitError, match=META):
        type(model)(
            str(clf_dir if kind == "CrossEncoder" else encoder_dir if kind == "SentenceTransformer" else mlm),
            device="meta",
        )


def test_optimize_for_inference_on_meta_is_refused_and_leaves_the_model_whole(tiny_model):
    """optimize_for_inference(model, device="meta") moved the caller's own model to meta before copying it: the copy
    was returned and the model passed in had lost every weight (its next forward: "Cannot copy out of meta tensor")."""
    model = tiny_model("BertForSequenceClassification", labels=2).eval()
    ids = torch.tensor([[2, 10, 11, 12, 3]])
    before = model(ids).logits
    with pytest.raises(BertkitError, match=META):
        bertkit.optimize_for_inference(model, device="meta")
    assert next(model.parameters()).device.type == "cpu"
    torch.testing.assert_close(model(ids).logits, before, rtol=0, atol=0)


def test_a_pipeline_on_a_device_no_model_runs_on_is_refused_when_made(clf_dir):
    """pipeline(task, d, device="meta") was made without a word; every call then failed in torch's autocast
    ("unsupported autocast device_type 'meta'")."""
    with pytest.raises(BertkitError, match=META):
        bertkit.pipeline("text-classification", clf_dir, device="meta")
    with pytest.raises(
        BertkitError,
        match=r"^device 'xla': bertkit runs models on cpu, cuda, mps \(a 'xla' device is "
        r"not one\); use auto, cpu, cuda or cuda:N$",
    ):
        bertkit.pipeline("text-classification", clf_dir, device="xla")
    assert bertkit.pipeline("text-classification", clf_dir, device="cpu:0").device.type == "cpu"


def test_an_option_given_as_none_takes_its_default(tmp_path, tiny_checkpoint):
    """transformers' token-classification reads ignore_labels=None as its default, ["O"]; bertkit's rule took None
    (or_none) and then failed in the pipeline's decode: TypeError "'NoneType' object is not iterable", with or without
    stride. Every option's None is now its default, as fill-mask's top_k=None and targets=None were."""
    d = tiny_checkpoint(
        tmp_path / "ner",
        "BertForTokenClassification",
        tokenizer=WORDS,
        labels=["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
    )
    tagger = bertkit.pipeline("token-classification", d)
    text = "john lives in new york films"
    for extra in ({}, {"stride": 2}):
        default = tagger(text, **extra)
        assert (
            tagger(text, ignore_labels=None, **extra) == default == tagger(text, ignore_labels=["O"], **extra)
        )
        assert tagger([text, text], **{"ignore_labels": None, "stride": None, **extra}) == tagger(
            [text, text], **extra
        )
    assert default["words"][0]["word"] == "john"
    fill = bertkit.pipeline(
        "fill-mask", tiny_checkpoint(tmp_path / "mlm", "BertForMaskedLM", tokenizer=WORDS)
    )
    assert fill("a good [MASK]", top_k=None, targets=None) == fill("a good [MASK]")


@pytest.mark.parametrize(
    "head",
    [
        "BertForSequenceClassification",
        "BertForTokenClassification",
        "BertForMaskedLM",
        "BertForPreTraining",
        "BertForNextSentencePrediction",
        "BertForQuestionAnswering",
        "BertForMultipleChoice",
    ],
)
def test_labels_and_inputs_that_are_not_tensors_are_named(head, tiny_model):
    """labels=[0, 1] (or a numpy array, or an int) reached the loss: AttributeError "'list' object has no attribute
    'numel'" (or 'dtype', 'squeeze', 'is_floating_point') from inside the head, as in transformers; input_ids as a
    list: "'list' object has no attribute 'dim'". Each is refused naming the argument, before the encoder runs."""
    model = tiny_model(head, labels=2).eval()
    ids = torch.tensor([[2, 10, 11, 3], [2, 12, 3, 0]])
    if head == "BertForMultipleChoice":
        ids = ids.unsqueeze(1).expand(2, 2, 4)
    targets = {
        "BertForQuestionAnswering": ("start_positions", "end_positions"),
        "BertForPreTraining": ("labels", "next_sentence_label"),
    }.get(head, ("labels",))
    for name in targets:
        for bad, shown in (([0, 1], "list [0, 1]"), (np.array([0, 1]), "ndarray [0 1]"), (1, "int 1")):
            with pytest.raises(
                BertkitError,
                match=rf"^{name} must be a torch tensor, got {re.escape(shown)}: pass "
                rf"torch.tensor\({name}\) \(a tokenizer call with "
                r"return_tensors='pt' gives tensors\)$",
            ):
                model(ids, **{name: bad})
    with pytest.raises(
        BertkitError, match=r"^input_ids must be a torch tensor, got list \[\[+2, 10, 11, 3\], "
    ):
        model(ids.tolist())
    with pytest.raises(BertkitError, match=r"^attention_mask must be a torch tensor, got list "):
        model(ids, attention_mask=(ids > 0).long().tolist())


@pytest.mark.parametrize("kind", ["SentenceTransformer", "CrossEncoder", "SparseEncoder"])
def test_the_references_own_defaults_given_explicitly_load_the_model(
    kind, encoder_dir, clf_dir, tmp_path, tiny_checkpoint
):
    """SentenceTransformer(d, trust_remote_code=False) and backend="torch" (sentence-transformers' defaults, which
    scripts pass through) were refused as if they asked for remote code or another backend; from_pretrained took
    trust_remote_code=False already. Any other value is still refused by name."""
    from bertkit import sentence

    d = {
        "SentenceTransformer": encoder_dir,
        "CrossEncoder": clf_dir,
        "SparseEncoder": tiny_checkpoint(tmp_path / "mlm", "BertForMaskedLM", tokenizer=WORDS),
    }[kind]
    cls = getattr(sentence, kind)
    plain = cls(str(d))
    given = cls(str(d), trust_remote_code=False, backend="torch")
    call = (
        (lambda m: m.predict([("a good film", "john")]))
        if kind == "CrossEncoder"
        else (lambda m: m.encode(["a good film", "john"], convert_to_tensor=True).to_dense())
    )
    torch.testing.assert_close(call(given), call(plain), rtol=0, atol=0)
    for name, value in (("trust_remote_code", True), ("backend", "onnx"), ("trust_remote_code", 0)):
        with pytest.raises(BertkitError, match=rf"^{kind}\({name}=\.\.\.\) is not implemented in bertkit: "):
            cls(str(d), **{name: value})


def test_a_pipelines_progress_is_true_false_or_none(clf_dir):
    """pipeline(..., progress="no") drew a progress bar (a non-empty str is true), and 1 or 0.0 passed as bools."""
    for bad in ("no", "yes", 1, 0.0):
        with pytest.raises(
            BertkitError,
            match=rf"^progress must be True, False or None \(None: a bar for long inputs "
            rf"only\), got {re.escape(repr(bad))}$",
        ):
            bertkit.pipeline("text-classification", clf_dir, progress=bad)
    assert bertkit.pipeline("text-classification", clf_dir, progress=False).progress is False


def test_a_trainers_output_dir_that_is_a_file_is_named_and_kept(tmp_path, tiny_model):
    """TrainingArguments(output_dir=<a file>): train() failed in mkdir with a bare FileExistsError ("[Errno 17] File
    exists"), and so did save_model(<a file>). Both are refused naming the path; the file is kept as it was."""
    from bertkit import DataCollatorWithPadding, Trainer, TrainingArguments
    from bertkit.tokenization import BertTokenizer

    tok = BertTokenizer({t: i for i, t in enumerate(WORDS)})
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes")
    data = [dict(tok("a good film"), labels=1), dict(tok("john lives in new york"), labels=0)]
    args = TrainingArguments(
        output_dir=str(notes), max_steps=1, per_device_train_batch_size=2, report_to="none", use_cpu=True
    )
    trainer = Trainer(
        model=tiny_model("BertForSequenceClassification", labels=2),
        args=args,
        train_dataset=data,
        processing_class=tok,
        data_collator=DataCollatorWithPadding(tok),
    )
    message = (
        rf"^{re.escape(str(notes))} is a file, not a directory: (the Trainer|save_model) writes a directory of "
        r"files; pass the path of a directory, new or to add to$"
    )
    with pytest.raises(BertkitError, match=message):
        trainer.train()
    with pytest.raises(BertkitError, match=message):
        trainer.save_model(str(notes))
    assert notes.read_text() == "my notes" and sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_an_embedding_pipelines_normalize_is_true_false_or_none(encoder_dir):
    """pipeline("feature-extraction", d, normalize="no") returned unit-length vectors (any non-empty string is true):
    quietly other numbers than the unnormalised ones asked for. Refused now, naming the value."""
    plain = bertkit.pipeline("feature-extraction", encoder_dir)("a good film")
    for bad in ("no", "yes", 1, 0):
        with pytest.raises(
            BertkitError,
            match=rf"^normalize must be True, False or None \(None: the task's default\), "
            rf"got {re.escape(repr(bad))}$",
        ):
            bertkit.pipeline("feature-extraction", encoder_dir, normalize=bad)
    assert bertkit.pipeline("feature-extraction", encoder_dir, normalize=False)("a good film") == plain
    unit = bertkit.pipeline("sentence-embedding", encoder_dir, normalize=None)("a good film")
    np.testing.assert_allclose(unit, np.asarray(plain) / np.linalg.norm(plain), rtol=1e-5, atol=1e-6)


def test_a_none_among_calibration_texts_is_named(clf_dir):
    """pipeline(..., quantize="int8", calibration_texts=["a", None]): the check of the texts' types used None as its
    "nothing found", so a None passed it and failed in the tokenizer (TypeError "the tokenizer takes str ..., got
    NoneType"), naming no text. Each bad text is named by its index."""
    for texts, shown in ((["a good film", None], "1 is NoneType 'None'"), ([3, "a"], "0 is int '3'")):
        with pytest.raises(
            BertkitError,
            match=rf"^calibration text {re.escape(shown)}; give strings or \(text, "
            r"text_pair\) tuples$",
        ):
            bertkit.pipeline("text-classification", clf_dir, quantize="int8", calibration_texts=texts)


def test_a_none_in_a_list_of_texts_is_named_with_its_place(clf_dir):
    """The same check, by item: tokenizer(["a", None]) passed the list's check (None was its "nothing found") and failed
    per text with TypeError "the tokenizer takes str (or a list of str), got NoneType"; a cross-encoder training row
    holding None was refused without its row. Both now name the item."""
    from bertkit.sentence import CrossEncoder
    from bertkit.sentence.cross_encoder import losses
    from bertkit.sentence.cross_encoder.data import CrossEncoderExamples
    from bertkit.tokenization import BertTokenizer

    tok = BertTokenizer({t: i for i, t in enumerate(WORDS)})
    with pytest.raises(BertkitError, match=r"; got a list holding NoneType None \(item 1\)$"):
        tok(["a good film", None])
    model = CrossEncoder(str(clf_dir))
    rows = [{"a": "a good film", "b": "john", "label": 1}, {"a": "a film", "b": None, "label": 0}]
    examples = CrossEncoderExamples(rows, model, losses.CrossEntropyLoss(model), "train_dataset")
    with pytest.raises(BertkitError, match=r"^row 1: expected texts in \['a', 'b'\], got NoneType 'None'$"):
        examples[1]
