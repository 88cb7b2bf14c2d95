"""Inputs a user can get wrong reach the model as a clear error naming the value and the fix, never as
PyTorch's embedding RuntimeError or an IndexError deep in the padding code."""

from __future__ import annotations

import copy
import json
import re

import pytest
import torch

from bertkit import BertConfig, BertForSequenceClassification, BertModel
from bertkit.errors import BertkitError

CONFIG = BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64)


@pytest.mark.parametrize("cls", [BertModel, BertForSequenceClassification])
def test_float_or_bool_ids_are_refused_naming_the_dtype(cls):
    model = cls(CONFIG).eval()
    with pytest.raises(BertkitError, match=r"input_ids must hold integer ids .* torch.float32.*\.long\(\)"):
        model(torch.tensor([[1.0, 2.0]]))
    with pytest.raises(BertkitError, match=r"token_type_ids must hold integer ids .* torch.bool"):
        model(torch.tensor([[1, 2]]), token_type_ids=torch.tensor([[True, False]]))


def test_inputs_on_different_devices_are_refused_naming_each():
    """A model takes its batch on the host or on its own device ("meta" stands in for a GPU here), never split
    between the two: the error names where each input is."""
    model = BertModel(CONFIG).eval()
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(BertkitError, match=r"different devices \(input_ids on cpu, attention_mask on meta\)"):
        model(ids, torch.ones(1, 3, dtype=torch.long, device="meta"))


def test_a_model_built_on_meta_and_loaded_with_assign_names_the_buffer_left_there():
    """Built under torch.device("meta") (accelerate's init_empty_weights(include_buffers=True)), then given its weights
    by load_state_dict(assign=True): the non-persistent position_ids stay on meta; the forward says so and how to
    build it instead (it failed in index_copy on a meta index; transformers' model computes other numbers)."""
    weights = BertModel(CONFIG).state_dict()
    with torch.device("meta"):
        model = BertModel(CONFIG)
    model.load_state_dict(weights, assign=True)
    with pytest.raises(BertkitError, match=r"^the position_ids buffer is on the meta device while the weights are on "
                                           r"cpu: .*init_empty_weights\(\) \(buffers on the host\)"):
        model(torch.tensor([[1, 2, 3], [4, 5, 0]]), torch.tensor([[1, 1, 1], [1, 1, 0]]))


def test_zero_length_sequences_are_refused_and_an_empty_batch_gives_an_empty_result():
    model = BertModel(CONFIG).eval()
    with pytest.raises(BertkitError, match=r"sequences are empty \(shape \(2, 0\)\)"):
        model(torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, 0, dtype=torch.long))
    with torch.no_grad():
        out = model(torch.zeros(0, 3, dtype=torch.long))
    assert out.last_hidden_state.shape == (0, 3, 32) and out.pooler_output.shape == (0, 32)


def test_long_ids_still_run_and_int32_ids_too():
    model = BertModel(CONFIG).eval()
    with torch.no_grad():
        a = model(torch.tensor([[1, 2, 3]])).last_hidden_state
        b = model(torch.tensor([[1, 2, 3]], dtype=torch.int32)).last_hidden_state
    torch.testing.assert_close(a, b, atol=0, rtol=0)


@pytest.mark.parametrize(("text", "said"), [(None, "got NoneType"), (5, "got int 5"), (b"abc", "got bytes"),
                                            ([1, 2], "a list holding int 1"),
                                            ([["a", "b", "c"]], "pass is_split_into_words=True")])
def test_the_tokenizer_names_what_it_takes(minilm_dir, text, said):
    from bertkit import BertTokenizer

    tok = BertTokenizer.from_pretrained(minilm_dir)
    with pytest.raises(BertkitError, match=r"takes a str, a list of str.*" + said):
        tok(text)
    assert tok([["a", "b"]], is_split_into_words=True)["input_ids"][0][1:3] == tok("a b")["input_ids"][1:3]


@pytest.mark.parametrize("mask, bad", [
    (torch.tensor([[1.0, 0.5, 1.0]]), r"0\.5 at \[0, 1\] \(torch\.float32\)"),
    (torch.tensor([[1, 2, 0]]), r"2 at \[0, 1\] \(torch\.int64\)"),
    (torch.tensor([[0.0, -10000.0, 0.0]]), r"-10000\.0 at \[0, 1\].*additive mask"),  # transformers' extended form
    (torch.tensor([[1.0, float("nan"), 1.0]]), r"nan at \[0, 1\]"),
    (torch.tensor([[1, 255, 0]], dtype=torch.uint8), r"255 at \[0, 1\]"),
])
def test_a_mask_holding_anything_but_0_and_1_is_refused_naming_the_value(mask, bad):
    model = BertModel(CONFIG).eval()
    with pytest.raises(BertkitError, match=rf"attention_mask holds {bad}"):
        model(torch.tensor([[1, 2, 3]]), attention_mask=mask)


def test_a_mask_of_0_and_1_in_any_dtype_gives_the_same_outputs():
    model = BertModel(CONFIG).eval()
    ids = torch.tensor([[1, 2, 3, 4], [5, 6, 0, 0]])
    long_mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]])
    with torch.no_grad():
        ref = model(ids, attention_mask=long_mask).last_hidden_state
        for dtype in (torch.bool, torch.int32, torch.uint8, torch.float32, torch.float16, torch.bfloat16):
            torch.testing.assert_close(model(ids, attention_mask=long_mask.to(dtype)).last_hidden_state, ref,
                                       atol=0, rtol=0)


def test_a_class_label_out_of_range_is_refused_naming_it_in_every_head():
    """A label column with more classes than the head has reached torch's IndexError from inside the loss."""
    from bertkit import (
        BertForMaskedLM,
        BertForMultipleChoice,
        BertForNextSentencePrediction,
        BertForPreTraining,
        BertForTokenClassification,
    )

    ids = torch.tensor([[1, 5, 7, 2], [1, 6, 2, 0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    clf = BertForSequenceClassification(CONFIG).eval()  # 2 labels
    assert torch.isfinite(clf(ids, mask, labels=torch.tensor([0, 1])).loss)
    with pytest.raises(BertkitError, match=r"labels holds 5, but this head has 2 classes \(ids 0 to 1"):
        clf(ids, mask, labels=torch.tensor([0, 5]))
    with pytest.raises(BertkitError, match=r"labels holds -1"):
        clf(ids, mask, labels=torch.tensor([-1, 0]))
    tagger = BertForTokenClassification(BertConfig.from_dict(CONFIG.to_dict(), num_labels=3)).eval()
    assert torch.isfinite(tagger(ids, mask, labels=torch.tensor([[-100, 2, 0, -100], [-100, 1, -100, -100]])).loss)
    with pytest.raises(BertkitError, match=r"labels holds 3, but this head has 3 classes"):
        tagger(ids, mask, labels=torch.tensor([[-100, 3, 0, -100], [-100, 1, -100, -100]]))
    # each head says what its labels are: next-sentence and masked-LM heads have no num_labels to give
    with pytest.raises(BertkitError, match=r"labels holds 2, but this head has 2 classes .*: a next-sentence label is 0"):
        BertForNextSentencePrediction(CONFIG).eval()(ids, mask, labels=torch.tensor([0, 2]))
    with pytest.raises(BertkitError, match=r"next_sentence_label holds 2, .*: a next-sentence label is 0 when"):
        BertForPreTraining(CONFIG).eval()(ids, mask, next_sentence_label=torch.tensor([0, 2]))
    v = CONFIG.vocab_size
    with pytest.raises(BertkitError, match=rf"labels holds {v}, but this head has {v} classes .*: masked-LM labels "
                                           rf"are ids of the model's vocabulary \(vocab_size {v}\)"):
        BertForMaskedLM(CONFIG).eval()(ids, mask, labels=torch.tensor([[-100, v, -100, -100], [-100] * 4]))
    # a multiple-choice head has as many classes as the input has choices: num_labels is no fix there
    choice = BertForMultipleChoice(CONFIG).eval()
    with pytest.raises(BertkitError, match=r"labels holds 2, but this head has 2 classes .*: a multiple-choice label "
                                           r"is the index of the right one of the input's 2 choices \(num_labels"):
        choice(ids[None].expand(2, 2, 4), mask[None].expand(2, 2, 4), labels=torch.tensor([1, 2]))
    with pytest.raises(BertkitError, match=r"labels has shape \(2, 2\) but the input has 2 example\(s\) of 2 choices: "
                                           "give one label per example"):  # one-hot rows of ids
        choice(ids[None].expand(2, 2, 4), mask[None].expand(2, 2, 4), labels=torch.tensor([[0, 1], [1, 0]]))


def test_multiple_choice_takes_class_ids_and_soft_targets_as_transformers():
    """transformers' BertForMultipleChoice passes float (B, C) labels to cross-entropy as probabilities over the
    choices (distillation, annotator votes); bertkit refused them ("labels must hold class ids")."""
    transformers = pytest.importorskip("transformers")
    from bertkit import BertForMultipleChoice

    torch.manual_seed(0)
    ours = BertForMultipleChoice(CONFIG).eval()
    theirs = transformers.BertForMultipleChoice(transformers.BertConfig(**CONFIG.to_dict())).eval()
    theirs.load_state_dict(ours.state_dict())
    ids = torch.tensor([[[1, 5, 7, 2], [1, 6, 2, 0], [1, 9, 8, 2]], [[1, 4, 2, 0], [1, 7, 7, 2], [1, 3, 2, 0]]])
    mask = (ids != 0).long()
    soft = torch.tensor([[0.0, 0.25, 0.75], [1.0, 0.0, 0.0]])
    with torch.no_grad():
        logits = ours(ids, mask).logits  # (2, 3)
        for labels in (torch.tensor([2, 0]), soft):
            a, b = ours(ids, mask, labels=labels).loss, theirs(ids, mask, labels=labels).loss
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    expected = -(soft * logits.log_softmax(-1)).sum(-1).mean()  # cross-entropy against the distributions
    torch.testing.assert_close(a, expected)


def test_float_labels_on_several_outputs_are_multi_label_as_in_transformers():
    """transformers reads float labels over num_labels > 1 as multi-label targets when the config names no
    problem_type; bertkit used them as class ids and failed on the shape."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    state = BertForSequenceClassification(CONFIG).state_dict()
    ids, labels = torch.tensor([[1, 5, 7, 2], [1, 6, 2, 3]]), torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    for target, kind in ((labels, "multi_label_classification"), (labels.argmax(-1), "single_label_classification")):
        config = copy.deepcopy(CONFIG)  # its own: forward writes the problem_type it infers (so did earlier tests here)
        config.problem_type = None
        ours = BertForSequenceClassification(config).eval()
        theirs = transformers.BertForSequenceClassification(transformers.BertConfig(**config.to_dict())).eval()
        ours.load_state_dict(state)
        theirs.load_state_dict(state)
        with torch.no_grad():
            torch.testing.assert_close(ours(ids, labels=target).loss, theirs(ids, labels=target).loss)
        # both write the inferred problem_type back, so the saved config tells a reloaded pipeline sigmoid or softmax
        assert ours.config.problem_type == theirs.config.problem_type == kind


def test_a_model_trained_on_multi_hot_targets_saves_multi_label_and_its_pipeline_scores_by_sigmoid(tmp_path,
                                                                                                    tiny_model):
    """A model trained on float multi-hot labels with no problem_type in its config: the saved config says
    multi_label_classification (as transformers' forward writes it), so the reloaded text-classification pipeline
    scores each label by a sigmoid; it saved none before, and the pipeline's softmax made the scores sum to 1."""
    from bertkit import BertTokenizer, pipeline

    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "red", "green", "blue"]
    model = tiny_model("BertForSequenceClassification", labels=["red", "blue"], vocab_size=len(vocab))
    model(torch.tensor([[2, 5, 3], [2, 7, 3]]), labels=torch.tensor([[1.0, 0.0], [1.0, 1.0]])).loss.backward()
    model.save_pretrained(tmp_path)
    BertTokenizer({t: i for i, t in enumerate(vocab)}).save_pretrained(tmp_path)
    assert json.loads((tmp_path / "config.json").read_text())["problem_type"] == "multi_label_classification"
    scores = pipeline("text-classification", str(tmp_path))("green red")["scores"]
    with torch.no_grad():
        logits = model.eval()(torch.tensor([[2, 6, 5, 3]])).logits[0]
    torch.testing.assert_close(torch.tensor([scores["red"], scores["blue"]]), torch.sigmoid(logits))


def _seq_pair(num_labels: int, dtype: torch.dtype = torch.float32, problem_type: str | None = None):
    """A tiny bertkit classifier and transformers' with the same weights, both in ``dtype``."""
    transformers = pytest.importorskip("transformers")
    config = BertConfig.from_dict(CONFIG.to_dict(), num_labels=num_labels, problem_type=problem_type)
    torch.manual_seed(0)
    ours = BertForSequenceClassification(config).eval()
    theirs = transformers.BertForSequenceClassification(transformers.BertConfig(**config.to_dict())).eval()
    theirs.load_state_dict(ours.state_dict())
    return ours.to(dtype), theirs.to(dtype)


@pytest.mark.parametrize("num_labels, problem_type, labels", [
    (1, None, torch.tensor([3.8, 0.35])),  # STS-B scores
    (2, None, torch.tensor([[0.3, 0.71], [1.0, 0.0]])),  # soft multi-label targets
])
def test_float_targets_of_a_bf16_model_are_not_rounded_to_bf16(num_labels, problem_type, labels):
    """transformers' losses promote bf16 logits against float32 targets: a float32 loss of the exact targets.
    bertkit cast the targets to the logits' bf16 (3.8 became 3.796875) and returned a bf16 loss: MiniLM on 8 STS-B
    dev pairs 0.0295 away from transformers' loss, a multi-label loss 0.6953 against 0.6957."""
    ours, theirs = _seq_pair(num_labels, torch.bfloat16, problem_type)
    ids = torch.tensor([[1, 5, 7, 2], [1, 6, 2, 3]])
    with torch.no_grad():
        a, b = ours(ids, labels=labels).loss, theirs(ids, labels=labels).loss
        rounded = ours(ids, labels=labels.bfloat16()).loss  # what bertkit computed
    assert a.dtype == b.dtype == torch.float32
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert abs(a.item() - rounded.item()) > 1e-4  # the rounding is large enough for this test to see


def test_soft_choice_targets_of_a_bf16_model_are_not_rounded_to_bf16():
    transformers = pytest.importorskip("transformers")
    from bertkit import BertForMultipleChoice

    torch.manual_seed(0)
    ours = BertForMultipleChoice(CONFIG).eval()
    theirs = transformers.BertForMultipleChoice(transformers.BertConfig(**CONFIG.to_dict())).eval()
    theirs.load_state_dict(ours.state_dict())
    ours, theirs = ours.bfloat16(), theirs.bfloat16()
    ids = torch.tensor([[[1, 5, 7, 2], [1, 6, 2, 3], [1, 9, 8, 2]]])
    soft = torch.tensor([[0.3, 0.33, 0.37]])
    with torch.no_grad():
        a, b = ours(ids, labels=soft).loss, theirs(ids, labels=soft).loss
    assert a.dtype == torch.float32
    torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_int32_class_ids_are_class_ids_in_every_head():
    """int32 labels (numpy's default int on some platforms, ``np.int32`` columns) are class ids: transformers'
    inference says so too, but both libraries then failed inside torch ("expected target dtype to be Long or Byte,
    but got Int"), in the classifier, the tagger, multiple choice and question answering."""
    from bertkit import BertForMultipleChoice, BertForQuestionAnswering, BertForTokenClassification

    ids = torch.tensor([[1, 5, 7, 2], [1, 6, 2, 0]])
    mask = (ids != 0).long()
    labels = torch.tensor([1, 0])
    tags = torch.tensor([[-100, 1, 0, -100], [-100, 1, -100, -100]])
    torch.manual_seed(0)
    with torch.no_grad():
        for model, kw in ((BertForSequenceClassification(copy.deepcopy(CONFIG)), dict(labels=labels)),
                          (BertForTokenClassification(CONFIG), dict(labels=tags)),
                          (BertForMultipleChoice(CONFIG), dict(labels=labels)),
                          (BertForQuestionAnswering(CONFIG), dict(start_positions=labels + 1, end_positions=labels + 2))):
            model.eval()
            x = dict(input_ids=ids[None].expand(2, 2, 4), attention_mask=mask[None].expand(2, 2, 4)) if isinstance(
                model, BertForMultipleChoice) else dict(input_ids=ids, attention_mask=mask)
            expected = model(**x, **kw).loss
            assert torch.equal(model(**x, **{k: v.int() for k, v in kw.items()}).loss, expected), type(model).__name__
    assert model.config.problem_type is None or model.config.problem_type  # (QA has none)
    with pytest.raises(BertkitError, match=r"start_positions must hold token indices \(an integer tensor\), got dtype "
                                           r"torch.float32"):
        model(ids, mask, start_positions=torch.tensor([1.0, 2.0]), end_positions=torch.tensor([2, 2]))


def test_labels_a_classifier_refuses_leave_its_problem_type_unset():
    """transformers infers multi_label_classification for int16 or float (B,) labels over 2 outputs, writes it into
    the config, and only then fails on the shape; the config keeps it, so the next batch of class ids runs as a
    multi-label loss, and a save writes it. bertkit wrote it back the same way; now labels it refuses, with a
    message naming the shape and the fix, leave problem_type as it was."""
    config = copy.deepcopy(CONFIG)
    config.problem_type = None
    model = BertForSequenceClassification(config).eval()
    ids = torch.tensor([[1, 5, 7, 2], [1, 6, 2, 3]])
    for labels in (torch.tensor([1, 0], dtype=torch.int16), torch.tensor([1.0, 0.0])):
        with pytest.raises(BertkitError, match=rf"labels of shape \(2,\) \({labels.dtype}\) for logits of shape "
                                               r"\(2, 2\): multi_label_classification takes 2 0/1 targets per example; "
                                               "class ids .* are an int64 or int32 tensor"):
            model(ids, labels=labels)
        assert model.config.problem_type is None
    with pytest.raises(BertkitError, match=r"labels of shape \(2, 2\) for 2 example\(s\): single_label_classification "
                                           r"takes one class id per example; multi-hot targets are a float tensor"):
        model(ids, labels=torch.tensor([[1, 0], [1, 1]]))
    assert model.config.problem_type is None
    model(ids, labels=torch.tensor([1, 0]))
    assert model.config.problem_type == "single_label_classification"


def test_a_bf16_masked_lm_loss_is_summed_in_float32_and_rounded_once():
    """A bf16 model's token loss was the bf16 sum of the token losses over their count: the sum rounded to bf16 (a
    last place of 8 at 1,400), so MiniLM's masked-LM loss on 32 CoNLL-2003 sentences read 10.6875 where the exact
    loss of its bf16 logits is 10.739 (transformers: 10.75). Now the float32 mean rounded once: the bf16 number
    nearest the exact loss, within one bf16 place of transformers'. Under autocast the loss stays float32."""
    transformers = pytest.importorskip("transformers")
    from bertkit import BertForMaskedLM

    config = BertConfig.from_dict(CONFIG.to_dict(), vocab_size=1000)
    torch.manual_seed(3)  # a draw whose bf16 sum rounds off the exact loss
    ours = BertForMaskedLM(config).eval()
    theirs = transformers.BertForMaskedLM(transformers.BertConfig(**config.to_dict())).eval()
    theirs.load_state_dict(ours.state_dict())
    ids = torch.randint(5, 1000, (8, 64), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            autocast = ours(ids, labels=ids).loss
        ours, theirs = ours.bfloat16(), theirs.bfloat16()
        a, b = ours(ids, labels=ids).loss, theirs(ids, labels=ids).loss
        logits = ours(ids).logits.view(-1, 1000)
    exact = torch.nn.functional.cross_entropy(logits.float(), ids.view(-1))
    summed_in_bf16 = torch.nn.functional.cross_entropy(logits, ids.view(-1), reduction="sum") / ids.numel()
    assert a.dtype == torch.bfloat16 and autocast.dtype == torch.float32
    assert a == exact.to(torch.bfloat16) != summed_in_bf16, (a, exact, summed_in_bf16)  # 6.90625, 6.8997, 6.9375
    assert abs(a.float() - b.float()) <= 2 ** -5  # one last place of bf16 at 4 to 8


def test_a_problem_type_assigned_after_loading_is_checked_when_the_loss_reads_it():
    """``model.config.problem_type = "multilabel"`` (a typo) after loading: bertkit's forward read any unknown value as
    multi-label and trained on it, and the config saved with it would not load again; transformers returns no loss.
    'single_label_classification' assigned to a one-output model scored a loss of 0.0 on every batch."""
    ids = torch.tensor([[1, 5, 7, 2], [1, 6, 2, 3]])
    model = BertForSequenceClassification(copy.deepcopy(CONFIG)).eval()
    model.config.problem_type = "multilabel"
    with pytest.raises(BertkitError, match=r"config.problem_type 'multilabel' is not one of \('regression', "
                                           r"'single_label_classification', 'multi_label_classification'\)"):
        model(ids, labels=torch.tensor([[1.0, 0.0], [0.0, 1.0]]))
    one = BertForSequenceClassification(BertConfig.from_dict(CONFIG.to_dict(), num_labels=1, problem_type=None)).eval()
    one.config.problem_type = "single_label_classification"
    with pytest.raises(BertkitError, match=r"'single_label_classification' needs num_labels > 1: .* its loss is 0.0"):
        one(ids, labels=torch.tensor([0, 0]))


def test_multiple_choice_takes_one_row_of_position_ids_as_transformers():
    """transformers flattens a multiple-choice head's position_ids to (-1, T), so one row (T,) or (1, T) serves every
    sequence; bertkit reshaped it to (B * C, T) and failed ("shape '[4, 26]' is invalid for input of size 26")."""
    transformers = pytest.importorskip("transformers")
    from bertkit import BertForMultipleChoice

    torch.manual_seed(0)
    ours = BertForMultipleChoice(CONFIG).eval()
    with torch.no_grad():  # away from the initialisation's near-zero scores, so the positions show in the loss
        for p in ours.parameters():
            p.add_(torch.randn_like(p) * 0.3)
    theirs = transformers.BertForMultipleChoice(transformers.BertConfig(**CONFIG.to_dict())).eval()
    theirs.load_state_dict(ours.state_dict())
    ids = torch.tensor([[[1, 5, 7, 2], [1, 6, 2, 3]], [[1, 9, 8, 2], [1, 4, 4, 2]]])
    labels = torch.tensor([1, 0])
    with torch.no_grad():
        expected = theirs(ids, position_ids=torch.tensor([[3, 2, 1, 0]]), labels=labels).loss
        for row in (torch.tensor([3, 2, 1, 0]), torch.tensor([[3, 2, 1, 0]]), torch.tensor([3, 2, 1, 0]).expand(2, 2, 4)):
            torch.testing.assert_close(ours(ids, position_ids=row, labels=labels).loss, expected, rtol=1e-6, atol=1e-7)
        assert abs(ours(ids, labels=labels).loss - expected) > 1e-4  # the positions are read


def test_regression_targets_of_another_shape_are_refused_not_reshaped():
    """One output, labels (2, 2) for 4 examples: bertkit flattened them and answered a loss of targets paired with
    other examples' outputs (transformers fails on the broadcast); labels for 2 of 4 examples failed in torch."""
    config = BertConfig.from_dict(CONFIG.to_dict(), num_labels=1, problem_type=None)
    model = BertForSequenceClassification(config).eval()
    ids = torch.tensor([[1, 5, 7, 2], [1, 6, 2, 3], [1, 9, 8, 2], [1, 4, 4, 2]])
    for labels in (torch.tensor([[0.5, 1.0], [2.0, 3.0]]), torch.tensor([0.5, 1.0])):
        with pytest.raises(BertkitError, match=rf"regression labels of shape {re.escape(str(tuple(labels.shape)))} for 4 "
                                               r"example\(s\): give one target per example, shape \(4,\)"):
            model(ids, labels=labels)
    with torch.no_grad():
        column, flat = model(ids, labels=torch.tensor([[0.5], [1.0], [2.0], [3.0]])).loss, model(
            ids, labels=torch.tensor([0.5, 1.0, 2.0, 3.0])).loss
        single = model(ids[:1], labels=torch.tensor(0.5)).loss
    assert torch.equal(column, flat) and single.item() > 0


def test_heads_answer_num_labels_where_transformers_heads_do():
    """``logits.view(-1, model.num_labels)`` in a custom loss (class weights, focal loss) was an AttributeError."""
    transformers = pytest.importorskip("transformers")
    from bertkit import BertForMultipleChoice, BertForQuestionAnswering, BertForTokenClassification

    config = BertConfig.from_dict(CONFIG.to_dict(), num_labels=5, problem_type=None)
    hf_config = transformers.BertConfig(**config.to_dict())
    for cls in (BertForSequenceClassification, BertForTokenClassification, BertForQuestionAnswering,
                BertForMultipleChoice):
        ours, theirs = cls(config), getattr(transformers, cls.__name__)(hf_config)
        assert getattr(ours, "num_labels", None) == getattr(theirs, "num_labels", None), cls.__name__
    assert BertForTokenClassification(config).num_labels == 5


def test_uint8_token_labels_are_compared_with_minus_100_as_int64():
    """A masked LM's labels were compared with -100 in their own dtype: in a uint8 tensor torch reads the scalar -100
    as 156, so the vocabulary id 156 was dropped from the loss without a word (vocab 200, uint8 labels [3, 156, 199,
    7]: loss 5.3023 where transformers and int64 labels give 5.3136). uint8 labels are now read as int64 ids
    first, as transformers' loss reads them, in the masked LM, pre-training and the tagger."""
    from bertkit import BertForMaskedLM, BertForPreTraining, BertForTokenClassification

    config = BertConfig.from_dict(CONFIG.to_dict(), vocab_size=200, num_labels=200)
    torch.manual_seed(0)
    ids = torch.randint(0, 200, (1, 4), generator=torch.Generator().manual_seed(1))
    labels = torch.tensor([[3, 156, 199, 7]])
    with torch.no_grad():
        for model in (BertForMaskedLM(config), BertForPreTraining(config), BertForTokenClassification(config)):
            model.eval()
            expected = model(ids, labels=labels).loss
            ignoring_156 = model(ids, labels=labels.masked_fill(labels == 156, -100)).loss
            assert model(ids, labels=labels.to(torch.uint8)).loss == expected != ignoring_156, type(model).__name__


def test_a_keyword_forward_does_not_take_is_a_type_error_naming_it():
    """transformers 5's forward(**kwargs) ignores an unknown keyword: a misspelt ``label=`` gives no loss, unsaid."""
    model = BertForSequenceClassification(CONFIG).eval()
    for name in ("label", "offset_mapping"):
        with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
            model(torch.tensor([[1, 5, 2]]), **{name: torch.tensor([1])})


def test_a_pair_for_a_model_with_one_token_type_is_refused_naming_type_vocab_size(tmp_path, tiny_checkpoint):
    """A checkpoint with type_vocab_size 1 given a text pair (the tokenizer's token type 1 on the second text) was
    refused as "token_type_ids holds 1, outside [0, 0] ...; was the input made with this model's tokenizer?", which
    it was: the same question from a text-classification pair, question answering and ``extract-features`` on
    "a ||| b" lines. The refusal now says the model reads single texts only and what to pass instead."""
    import bertkit

    one_type = BertConfig.from_dict(CONFIG.to_dict(), type_vocab_size=1)
    with pytest.raises(BertkitError, match=r"type_vocab_size 1.*single texts only.*type_vocab_size 2 for pairs"):
        BertModel(one_type).eval()(torch.tensor([[1, 5, 2, 6, 2]]), token_type_ids=torch.tensor([[0, 0, 0, 1, 1]]))
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "good", "film", "bad"]
    directory = tiny_checkpoint(tmp_path / "clf", "BertForSequenceClassification", tokenizer=words, labels=2,
                                type_vocab_size=1, num_attention_heads=2)
    clf = bertkit.pipeline("text-classification", directory)
    assert clf("a good film")["label"] in ("LABEL_0", "LABEL_1")  # a single text runs
    with pytest.raises(BertkitError, match=r"token_type_ids holds 1 \(a text pair's second text\).*type_vocab_size 1"):
        clf({"text": "a good film", "text_pair": "bad"})
    # ids past a table of two or more rows keep the range message
    with pytest.raises(BertkitError, match=r"token_type_ids holds 2, outside \[0, 1\] \(type_vocab_size 2"):
        BertModel(CONFIG).eval()(torch.tensor([[1, 5, 2]]), token_type_ids=torch.tensor([[0, 2, 2]]))
