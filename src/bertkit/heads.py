"""Task heads on the BERT encoder: thin, alike, one output dataclass each.

Every head model holds the encoder as ``self.bert``, computes its loss only when labels are given, and
returns one small dataclass (paper section 3 / Figure 4: [CLS]'s pooled state for sentence and pair tasks, the
token states for tagging and span extraction). Module names are transformers', so state dicts interchange.

A head is declared here and nowhere else: its modules' names are its checkpoint keys, its ``output_names``
what an exported graph returns; ``MODEL_CLASSES`` and the ``AutoModelFor<Task>`` classes derive from it.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit.checkpoint_io import PretrainedMixin
from bertkit.compat import TupleAccess, returns_dataclass, tied_output_embeddings
from bertkit.config import PROBLEM_TYPES, BertConfig
from bertkit.construction import initialise_on_construction, new_linear
from bertkit.errors import BertkitError
from bertkit.head_losses import (
    IGNORE_INDEX,
    check_class_labels,
    check_token_labels,
    float_targets,
    integer_ids,
    masked_lm_loss,
    masked_lm_rows,
    masked_lm_scores,
    token_loss,
)
from bertkit.model_checks import require_tensors
from bertkit.modeling import BertModel, BertModelOutput, activation, init_bert_weights

# ---------------------------------------------------------------------------------------------------
# Outputs
# ---------------------------------------------------------------------------------------------------


@dataclass
class PreTrainingOutput(TupleAccess):
    # transformers' BertForPreTraining order.
    loss: Tensor | None  # mlm_loss + nsp_loss, for the labels given (the MLM part over num_items_in_batch if given)
    mlm_loss: Tensor | None
    nsp_loss: Tensor | None
    # Without labels (B, T, V); with labels (N, V): only the N labelled positions, as the paper's code (it
    # saves the V-wide GEMM on the ~85% of tokens that carry no loss). Traced, (K, V): the N rows, then rows whose
    # label is -100, up to the fixed K of ``max_predictions_per_seq``.
    prediction_logits: Tensor
    seq_relationship_logits: Tensor | None  # (B, 2): 0 = B follows A, 1 = B is random
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None  # with output_attentions: L tensors (B, nh, T, T)
    tuple_fields: ClassVar[tuple[str, ...]] = ("loss", "prediction_logits", "seq_relationship_logits",
                                               "hidden_states", "attentions")


@dataclass
class MaskedLMOutput(TupleAccess):
    """transformers' ``MaskedLMOutput``; ``logits`` as ``PreTrainingOutput.prediction_logits``."""

    loss: Tensor | None  # mean over labelled tokens, or their sum over num_items_in_batch if given
    logits: Tensor
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None
    mlm_loss: Tensor | None = None  # always the mean over this batch's labelled tokens (for logging)
    tuple_fields: ClassVar[tuple[str, ...]] = ("loss", "logits", "hidden_states", "attentions")

    # The pre-training names, so MLM-only pre-training reads both heads' outputs alike.
    prediction_logits = property(lambda self: self.logits)
    nsp_loss = None
    seq_relationship_logits = None


@dataclass
class ClassifierOutput(TupleAccess):
    """Sequence, pair, token, next-sentence and multiple-choice heads: logits and an optional loss."""

    loss: Tensor | None
    logits: Tensor  # (B, C) sequence/NSP/choice; (B, T, C) tokens
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None  # with output_attentions: L tensors (B, nh, T, T)
    tuple_fields: ClassVar[tuple[str, ...]] = ("loss", "logits", "hidden_states", "attentions")


@dataclass
class QuestionAnsweringOutput(TupleAccess):
    loss: Tensor | None
    start_logits: Tensor  # (B, T)
    end_logits: Tensor  # (B, T)
    hidden_states: tuple[Tensor, ...] | None = None
    attentions: tuple[Tensor, ...] | None = None  # with output_attentions: L tensors (B, nh, T, T)
    tuple_fields: ClassVar[tuple[str, ...]] = ("loss", "start_logits", "end_logits", "hidden_states", "attentions")


# torch.export returns these dataclasses as they are (pytree nodes: fields are children); torch.jit.trace
# and ONNX take tuples instead (bertkit.inference.export.TupleOutputModel).
for _output in (PreTrainingOutput, MaskedLMOutput, ClassifierOutput, QuestionAnsweringOutput):
    torch.utils._pytree.register_dataclass(_output)


# ---------------------------------------------------------------------------------------------------
# Shared pieces
# ---------------------------------------------------------------------------------------------------


class BertPredictionHeadTransform(nn.Module):
    """The MLM head's transform: dense + activation + LayerNorm (google-research/bert ``get_masked_lm_output``)."""

    def __init__(self, config: BertConfig):
        super().__init__()
        self.dense = new_linear(config.hidden_size, config.hidden_size)
        self.transform_act_fn = activation(config.hidden_act)
        self.LayerNorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)  # noqa: N815 - transformers' name

    def forward(self, hidden: Tensor) -> Tensor:
        return self.LayerNorm(self.transform_act_fn(self.dense(hidden)))


def _tied_copies_as_their_own_tensors(module: nn.Module, state_dict: dict, prefix: str, _metadata: Any) -> None:
    """``state_dict()`` lists the tied decoder as copies: safetensors (transformers' ``Trainer`` saves with it)
    refuses tensors that share memory. ``keep_vars=True`` (the Parameters themselves) is left alone."""
    for name in ("decoder.weight", "decoder.bias"):
        value = state_dict.get(prefix + name)
        if value is not None and not isinstance(value, nn.Parameter):
            state_dict[prefix + name] = value.clone()


class BertLMPredictionHead(nn.Module):
    """Transform, then ``decoder``: a ``Linear(H, V)`` whose weight *is* the word-embedding matrix and whose bias
    *is* ``bias`` (google-research/bert's ``get_masked_lm_output``; transformers ties them the same way)."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding):
        super().__init__()
        self.transform = BertPredictionHeadTransform(config)
        self.bias = nn.Parameter(torch.zeros(config.vocab_size))
        if initialise_on_construction():
            # transformers' decoder is a Linear(H, V) of its own until tie_weights gives it the word embeddings: its
            # construction draws (here) and its normal draw (_initialise_unloaded, built=True) are thrown away, as
            # there, so every later draw (the NSP layer, dropout masks, shuffles) starts where transformers' does
            nn.Linear(config.hidden_size, config.vocab_size)
        self.tie(word_embeddings)
        self.register_state_dict_post_hook(_tied_copies_as_their_own_tensors)

    def tie(self, word_embeddings: nn.Embedding) -> None:
        """(Re)point ``decoder`` at ``word_embeddings``' weight and at ``bias`` (after the embeddings are replaced)."""
        self.decoder = tied_output_embeddings(word_embeddings, self.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.decoder(self.transform(hidden))  # (..., V)


class BertPreTrainingHeads(nn.Module):
    """``cls``: the masked-LM head (``predictions``) and/or the next-sentence classifier (``seq_relationship``,
    H -> 2 on the pooled state), under transformers' names for BertForPreTraining, BertForMaskedLM and
    BertForNextSentencePrediction."""

    def __init__(self, config: BertConfig, word_embeddings: nn.Embedding | None, nsp: bool):
        super().__init__()
        if word_embeddings is not None:
            self.predictions = BertLMPredictionHead(config, word_embeddings)
        if nsp:
            self.seq_relationship = new_linear(config.hidden_size, 2)

    def forward(self, *states: Tensor) -> Tensor | tuple[Tensor, Tensor]:
        """transformers' call of ``cls``, so a hook on it runs: the masked-LM scores of ``(token states)``, the
        next-sentence scores of ``(pooled states)``, or both of ``(token states, pooled states)`` for pre-training."""
        heads = [m for m in (getattr(self, "predictions", None), getattr(self, "seq_relationship", None))
                 if m is not None]
        if len(states) != len(heads):
            raise BertkitError(f"cls takes {len(heads)} tensor(s), one per head ({', '.join(type(h).__name__ for h in heads)}), "
                               f"got {len(states)}")
        scores = tuple(head(x) for head, x in zip(heads, states))
        return scores if len(scores) > 1 else scores[0]


_NSP_FIX = "a next-sentence label is 0 when sentence B follows A, 1 when B is a random sentence"


class _HeadModel(PretrainedMixin, nn.Module):
    """Common construction: the encoder (with or without pooler), then the head's own modules (``build_head``),
    initialised."""

    uses_pooler = True

    def __init__(self, config: BertConfig):
        super().__init__()
        self.config = config
        self.bert = BertModel(config, add_pooling_layer=self.uses_pooler)
        self.build_head(config)
        if initialise_on_construction():  # else from_pretrained initialises what the checkpoint lacks
            self._initialise_unloaded({name for name, _ in self.bert.named_parameters(prefix="bert")}, built=True)

    def build_head(self, config: BertConfig) -> None:
        """Make the head's modules, under transformers' names (they are its checkpoint keys)."""
        raise NotImplementedError

    def _init_weights(self, module: nn.Module, keep: Container[str] = ()) -> None:
        if isinstance(module, BertLMPredictionHead):  # its own output bias, zero as in transformers
            if "bias" not in keep:
                with torch.no_grad():
                    module.bias.zero_()
        else:
            init_bert_weights(module, self.config.initializer_range, keep)

    def _encode(self, input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                output_hidden_states: bool | None, output_attentions: bool | None, **targets: Any) -> BertModelOutput:
        require_tensors(**targets)  # the labels given, before the encoder runs
        return self.bert(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                         output_hidden_states=output_hidden_states, output_attentions=output_attentions,
                         return_dict=True)  # the head reads fields; config.return_dict applies to its own output

    def _result(self, result: TupleAccess, return_dict: bool | None):
        """The output dataclass, or its tuple for ``return_dict=False`` (default: ``config.return_dict``; the tuple
        under ``torch.jit.trace``)."""
        return result if returns_dataclass(self.config.return_dict, return_dict) else result.to_tuple()


# transformers' ``model.num_labels`` on the heads that set it (sequence and token classification, span QA), read in
# custom losses (``logits.view(-1, model.num_labels)``); the config's, so it follows a change of num_labels.
config_num_labels = property(lambda self: self.config.num_labels)


class _ClassifierHeadModel(_HeadModel):
    """A fine-tuning head that is dropout then one Linear, under transformers' names (``dropout``,
    ``classifier``): ``classifier_outputs`` outputs, or ``config.num_labels`` when None."""

    classifier_outputs: int | None = None

    def build_head(self, config: BertConfig) -> None:
        p = config.classifier_dropout
        self.dropout = nn.Dropout(config.hidden_dropout_prob if p is None else p)
        outputs = config.num_labels if self.classifier_outputs is None else self.classifier_outputs
        if outputs < 1:  # transformers builds a classifier of no outputs, whose logits are empty
            raise BertkitError(f"{type(self).__name__}: config.id2label is empty (num_labels 0), so its classifier "
                               "would have no outputs; name the labels (id2label={0: \"NEGATIVE\", 1: \"POSITIVE\"}) "
                               "or pass num_labels=")
        self.classifier = new_linear(config.hidden_size, outputs)


# ---------------------------------------------------------------------------------------------------
# Pre-training heads
# ---------------------------------------------------------------------------------------------------


class BertForPreTraining(_HeadModel):
    """Masked LM + next-sentence prediction (paper section 3.1, tasks #1 and #2)."""

    output_names = ("prediction_logits", "seq_relationship_logits")
    # Traced (torch.compile), the masked-LM head scores B * this many rows with labels, whatever their count (None: T
    # per sequence); set it to the data's max_predictions_per_seq to score as few rows as eagerly (_fixed_rows).
    max_predictions_per_seq: int | None = None

    def build_head(self, config: BertConfig) -> None:
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings, nsp=True)

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, position_ids: Tensor | None = None,
                inputs_embeds: Tensor | None = None, labels: Tensor | None = None,
                next_sentence_label: Tensor | None = None,
                *, output_hidden_states: bool | None = None,
                output_attentions: bool | None = None, return_dict: bool | None = None,
                num_items_in_batch: Tensor | float | None = None) -> PreTrainingOutput:
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_hidden_states, output_attentions, labels=labels,
                           next_sentence_label=next_sentence_label)
        hidden, target = masked_lm_rows(out, labels, self.max_predictions_per_seq)
        scores, nsp_logits = self.cls(hidden, out.pooler_output)  # (B, T, V) or (N, V); (B, 2)
        logits, mlm_loss, mlm_objective = masked_lm_scores(scores, target, num_items_in_batch)
        nsp_loss = None
        if next_sentence_label is not None:
            nsp_target = check_class_labels(next_sentence_label.view(-1), 2, "next_sentence_label", _NSP_FIX)
            nsp_loss = F.cross_entropy(nsp_logits, nsp_target)
        parts = [x for x in (mlm_objective, nsp_loss) if x is not None]
        loss = sum(parts[1:], parts[0]) if parts else None
        result = PreTrainingOutput(loss, mlm_loss, nsp_loss, logits, nsp_logits, out.hidden_states, out.attentions)
        return self._result(result, return_dict)


class BertForMaskedLM(_HeadModel):
    """Masked LM alone (no pooler, no NSP), e.g. for fill-mask or MLM-only pre-training."""

    output_names = ("prediction_logits",)  # an exported graph names it as BertForPreTraining does
    # Traced (torch.compile), the masked-LM head scores B * this many rows with labels, whatever their count (None: T
    # per sequence); set it to the data's max_predictions_per_seq to score as few rows as eagerly (_fixed_rows).
    max_predictions_per_seq: int | None = None
    uses_pooler = False

    def build_head(self, config: BertConfig) -> None:
        self.cls = BertPreTrainingHeads(config, self.bert.embeddings.word_embeddings, nsp=False)

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, position_ids: Tensor | None = None,
                inputs_embeds: Tensor | None = None, labels: Tensor | None = None,
                *, output_hidden_states: bool | None = None,
                output_attentions: bool | None = None, return_dict: bool | None = None,
                num_items_in_batch: Tensor | float | None = None) -> MaskedLMOutput:
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_hidden_states, output_attentions, labels=labels)
        logits, mean, loss = masked_lm_loss(self.cls, out, labels, num_items_in_batch, self.max_predictions_per_seq)
        result = MaskedLMOutput(loss, logits, out.hidden_states, out.attentions, mlm_loss=mean)
        return self._result(result, return_dict)


class BertForNextSentencePrediction(_HeadModel):
    """Next-sentence prediction alone: is segment B the true continuation of A (label 0) or random (1)?"""

    output_names = ("logits",)

    def build_head(self, config: BertConfig) -> None:
        self.cls = BertPreTrainingHeads(config, None, nsp=True)

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, position_ids: Tensor | None = None,
                inputs_embeds: Tensor | None = None, labels: Tensor | None = None,
                *, output_hidden_states: bool | None = None,
                output_attentions: bool | None = None, return_dict: bool | None = None) -> ClassifierOutput:
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_hidden_states, output_attentions, labels=labels)
        logits = self.cls(out.pooler_output)
        loss = F.cross_entropy(logits, check_class_labels(labels.view(-1), 2, fix=_NSP_FIX)) if labels is not None else None
        result = ClassifierOutput(loss, logits, out.hidden_states, out.attentions)
        return self._result(result, return_dict)


# ---------------------------------------------------------------------------------------------------
# Fine-tuning heads (paper section 4, Figure 4)
# ---------------------------------------------------------------------------------------------------


class BertForSequenceClassification(_ClassifierHeadModel):
    """Single sentence or pair -> label (or score): a linear layer on the pooled [CLS] state.

    The loss follows ``config.problem_type``; when unset, one output means regression (STS-B, MSE) and
    several mean single-label classification (cross-entropy), as transformers decides.
    """

    output_names = ("logits",)
    num_labels = config_num_labels

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, position_ids: Tensor | None = None,
                inputs_embeds: Tensor | None = None, labels: Tensor | None = None,
                *, output_hidden_states: bool | None = None,
                output_attentions: bool | None = None, return_dict: bool | None = None) -> ClassifierOutput:
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_hidden_states, output_attentions, labels=labels)
        logits = self.classifier(self.dropout(out.pooler_output))  # (B, C)
        loss = None
        if labels is not None:
            # transformers' inference when the config names none: one output is a regression, integer labels
            # are class ids, float labels over several outputs are multi-label targets. Written back once the
            # loss is computed, as transformers does: a model trained on multi-hot targets saves
            # multi_label_classification, so that its reloaded pipeline scores with a sigmoid, not a softmax over
            # labels that are not exclusive; labels refused below leave the config as it was.
            kind = self.config.problem_type or (
                "regression" if self.config.num_labels == 1 else
                "single_label_classification" if labels.dtype in (torch.long, torch.int) else
                "multi_label_classification")
            if kind == "regression" and self.config.num_labels == 1:
                if labels.squeeze().shape != logits.squeeze().shape:  # (B,) or (B, 1); a (2, 2) read as 4 would pass
                    raise BertkitError(f"regression labels of shape {tuple(labels.shape)} for {logits.shape[0]} "
                                       f"example(s): give one target per example, shape ({logits.shape[0]},)")
                loss = F.mse_loss(logits.squeeze(-1), float_targets(labels, logits).view(-1))
            elif kind == "regression":  # several targets per example, as transformers: (B, C) against (B, C)
                if labels.shape != logits.shape:
                    raise BertkitError(f"regression labels of shape {tuple(labels.shape)} for logits of shape "
                                       f"{tuple(logits.shape)}: give {self.config.num_labels} targets per example")
                loss = F.mse_loss(logits, float_targets(labels, logits))
            elif kind == "single_label_classification":
                if logits.shape[-1] == 1:  # the config refuses this pair; an assignment after it does not
                    raise BertkitError("config.problem_type 'single_label_classification' needs num_labels > 1: a "
                                       "softmax over one output scores every input 1.0 and its loss is 0.0; set "
                                       "problem_type 'regression' for one output")
                if labels.numel() != logits.shape[0]:  # torch's "Expected input batch_size (8) to match target (16)"
                    raise BertkitError(f"labels of shape {tuple(labels.shape)} for {logits.shape[0]} example(s): "
                                       "single_label_classification takes one class id per example; multi-hot "
                                       "targets are a float tensor (B, num_labels)")
                loss = F.cross_entropy(logits, check_class_labels(labels.view(-1), logits.shape[-1]))
            elif kind == "multi_label_classification":
                if labels.shape != logits.shape:  # torch's "Target size must be the same as input size"
                    raise BertkitError(
                        f"labels of shape {tuple(labels.shape)} ({labels.dtype}) for logits of shape "
                        f"{tuple(logits.shape)}: multi_label_classification takes {self.config.num_labels} 0/1 targets "
                        "per example; class ids (one per example) are an int64 or int32 tensor"
                        + (", or set problem_type='single_label_classification'" if not labels.is_floating_point()
                           and self.config.problem_type is None else ""))
                loss = F.binary_cross_entropy_with_logits(logits, float_targets(labels, logits))
            else:  # assigned after the config checked itself (transformers returns no loss, without a word)
                raise BertkitError(f"config.problem_type {kind!r} is not one of {PROBLEM_TYPES}")
            self.config.problem_type = kind
        result = ClassifierOutput(loss, logits, out.hidden_states, out.attentions)
        return self._result(result, return_dict)


class BertForTokenClassification(_ClassifierHeadModel):
    """A label per token (NER): a linear layer on every token state; -100 labels carry no loss."""

    output_names = ("logits",)
    num_labels = config_num_labels
    uses_pooler = False

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, position_ids: Tensor | None = None,
                inputs_embeds: Tensor | None = None, labels: Tensor | None = None,
                *, output_hidden_states: bool | None = None,
                output_attentions: bool | None = None, return_dict: bool | None = None,
                num_items_in_batch: Tensor | float | None = None) -> ClassifierOutput:
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_hidden_states, output_attentions, labels=labels)
        stored = self.classifier(self.dropout(out.tokens))  # per stored token: (B, T, C) or (N, C)
        loss = None
        if labels is not None:
            check_token_labels(labels, out)
            labels = integer_ids(labels, "labels", "class ids")  # as masked_lm_loss: uint8 would read -100 as 156
            # Padding carries label -100, so the loss over stored tokens equals the loss over the rectangle.
            if out.token_layout.is_padded:
                target = labels.reshape(-1)
            else:
                target = labels.reshape(-1)[out.token_layout.flat_index]
                if int((target != IGNORE_INDEX).sum()) != int((labels != IGNORE_INDEX).sum()):
                    raise BertkitError("token labels at padding positions must be -100 (pad labels with -100, as "
                                     "bertkit's collate does); otherwise padding would count in the loss")
            _, loss = token_loss(stored.reshape(-1, stored.size(-1)), target, num_items_in_batch)
        result = ClassifierOutput(loss, out.token_layout.to_batch(stored), out.hidden_states, out.attentions)
        return self._result(result, return_dict)


class BertForQuestionAnswering(_HeadModel):
    """Span extraction (SQuAD): start and end logits per token from one H -> 2 layer (paper section 4.2)."""

    output_names = ("start_logits", "end_logits")
    num_labels = config_num_labels
    uses_pooler = False
    saved_num_labels = 2  # start and end, whatever num_labels says (transformers' qa_outputs has num_labels outputs)

    def build_head(self, config: BertConfig) -> None:
        self.qa_outputs = new_linear(config.hidden_size, 2)

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, position_ids: Tensor | None = None,
                inputs_embeds: Tensor | None = None, start_positions: Tensor | None = None,
                end_positions: Tensor | None = None,
                *, output_hidden_states: bool | None = None,
                output_attentions: bool | None = None, return_dict: bool | None = None) -> QuestionAnsweringOutput:
        out = self._encode(input_ids, attention_mask, token_type_ids, position_ids, inputs_embeds,
                           output_hidden_states, output_attentions, start_positions=start_positions,
                           end_positions=end_positions)
        logits = out.token_layout.to_batch(self.qa_outputs(out.tokens))  # (B, T, 2)
        if attention_mask is not None:
            # google-research/bert and transformers run the span softmax over padding too, so their loss depends
            # on a batch's padding; here padding gets the lowest finite logit, so the loss is the same in every
            # layout. Answers never lie in padding, so decoding is unchanged.
            pad = (attention_mask == 0).unsqueeze(-1)  # (B, T, 1)
            logits = logits.masked_fill(pad, torch.finfo(logits.dtype).min)
        start_logits, end_logits = logits.unbind(-1)  # 2 x (B, T)
        loss = None
        if start_positions is not None and end_positions is not None:
            # Positions outside the window (clamped to T) are ignored, as transformers does.
            T = start_logits.size(1)
            s, e = (integer_ids(p, name, "token indices").view(-1).clamp(0, T)
                    for name, p in (("start_positions", start_positions), ("end_positions", end_positions)))
            if attention_mask is not None:
                padded_mask = F.pad(attention_mask, (0, 1), value=1)  # (B, T + 1): index T means "ignored"
                rows = torch.arange(len(s), device=s.device)
                if not bool(padded_mask[rows, s].all() and padded_mask[rows, e].all()):
                    name, i, p = next((n, i, p) for n, p in (("start_positions", s), ("end_positions", e))
                                      for i in range(len(p)) if not padded_mask[i, p[i]])
                    raise BertkitError(f"start/end positions point at padding: {name}[{i}] is {int(p[i])}, where "
                                       f"attention_mask[{i}] is 0 and the span softmax gives no probability; answers "
                                       f"must lie on real tokens ({T} or more, past the sequence: ignored)")
            loss = (F.cross_entropy(start_logits, s, ignore_index=T) + F.cross_entropy(end_logits, e, ignore_index=T)) / 2
        result = QuestionAnsweringOutput(loss, start_logits, end_logits, out.hidden_states, out.attentions)
        return self._result(result, return_dict)


class BertForMultipleChoice(_ClassifierHeadModel):
    """Pick one of C continuations (SWAG, paper section 4.4): score each [CLS] A [SEP] choice [SEP] with
    one H -> 1 layer on its pooled state and softmax over the C scores. ``labels``: (B,) indices of the right
    choice, or float (B, C) probabilities over the choices (soft targets, as transformers' head takes them)."""

    output_names = ("logits",)
    classifier_outputs = 1  # one score per choice

    def forward(self, input_ids: Tensor | None = None, attention_mask: Tensor | None = None,
                token_type_ids: Tensor | None = None, position_ids: Tensor | None = None,
                inputs_embeds: Tensor | None = None, labels: Tensor | None = None,
                *, output_hidden_states: bool | None = None,
                output_attentions: bool | None = None, return_dict: bool | None = None) -> ClassifierOutput:
        require_tensors(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                        position_ids=position_ids, inputs_embeds=inputs_embeds, labels=labels)
        given = input_ids if input_ids is not None else inputs_embeds
        if given is None or given.dim() != (3 if input_ids is not None else 4):
            raise BertkitError("input_ids must be (batch, num_choices, seq_len) (or inputs_embeds (batch, num_choices, "
                               f"seq_len, hidden_size)), got {None if given is None else tuple(given.shape)}")
        B, C, T = given.shape[:3]
        flat = [x.reshape(B * C, T) if x is not None else None
                for x in (input_ids, attention_mask, token_type_ids)]  # (B * C, T) each
        # position_ids as transformers flattens them: (B, C, T) to (B * C, T), one row (T,) or (1, T) for every
        # sequence (the encoder broadcasts a single row)
        flat.append(position_ids.reshape(-1, position_ids.shape[-1]) if position_ids is not None else None)
        embeds = inputs_embeds.reshape(B * C, T, -1) if inputs_embeds is not None else None
        out = self._encode(*flat, embeds, output_hidden_states, output_attentions)
        logits = self.classifier(self.dropout(out.pooler_output)).view(B, C)  # (B, C)
        loss = None
        if labels is not None and labels.is_floating_point() and tuple(labels.shape) == (B, C):
            loss = F.cross_entropy(logits, float_targets(labels, logits))  # a distribution over the choices, as transformers
        elif labels is not None:
            if labels.numel() != B:  # (B, C) class ids were read as B * C labels: torch's batch-size error
                raise BertkitError(f"labels has shape {tuple(labels.shape)} but the input has {B} example(s) of {C} "
                                   "choices: give one label per example, the index of its right choice (or float "
                                   f"({B}, {C}) probabilities over the choices)")
            fix = (f"a multiple-choice label is the index of the right one of the input's {C} choices "
                   "(num_labels plays no part)")
            loss = F.cross_entropy(logits, check_class_labels(labels.view(-1), C, fix=fix))
        result = ClassifierOutput(loss, logits, out.hidden_states, out.attentions)
        return self._result(result, return_dict)


# bertkit's model classes by name (config.json's ``architectures``): every model class here that declares its
# output names, the encoder first, then the heads in the order above.
MODEL_CLASSES: dict[str, type[PretrainedMixin]] = {
    name: obj for name, obj in list(globals().items())
    if isinstance(obj, type) and issubclass(obj, PretrainedMixin) and hasattr(obj, "output_names")}
