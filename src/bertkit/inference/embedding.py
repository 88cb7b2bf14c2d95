"""The embedding pipelines: a text (or pair) -> one vector (``feature-extraction``), and a sentence-transformers
directory's embeddings as its modules declare them (``sentence-embedding``: pooling, prompts, Normalize, length).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from bertkit.errors import BertkitError, is_whole
from bertkit.inference import tasks
from bertkit.inference.base import Pipeline
from bertkit.inference.options import Option, checked_flag
from bertkit.inference.pipelines import TextOrPairPipeline, per_row
from bertkit.inference.runner import readable
from bertkit.modeling import BertModel
from bertkit.sentence.directory import ST_CONFIG, OtherModelKind, SentenceDirectory, read_directory
from bertkit.sentence.finite import unit_length
from bertkit.sentence.pooling import MODES as POOLING_MODES
from bertkit.sentence.pooling import pool_tokens
from bertkit.sentence.prompts import DEFAULT_PROMPTS, prompt_tokens
from bertkit.tokenization import BertTokenizer

logger = logging.getLogger("bertkit")


POOLINGS = (*POOLING_MODES, "none")


def sentence_directory(directory: Path) -> SentenceDirectory:
    """What a sentence-transformers directory declares (``bertkit.sentence.directory``), once a pipeline can honour
    it: a default_prompt_name that names no prompt, which sentence-transformers and ``SentenceTransformer`` refuse to
    load, is refused (the pipeline embedded with no prompt)."""
    try:
        saved = read_directory(directory)
    except OtherModelKind as e:  # and the task that runs it
        task = next(t.name for t in tasks.TASK_LIST if t.sentence_class == e.kind)
        raise BertkitError(f"{e}, or run it as the {task} task (bertkit.pipeline, predict, serve --task)") from None
    if saved.dense:  # its vectors pass through trained layers the pipelines do not run
        raise BertkitError(f"{directory} has Dense modules after its Pooling ({', '.join(d.name for d in saved.dense)}), "
                           "which the embedding pipelines, predict and serve do not implement: load it with "
                           "bertkit.sentence.SentenceTransformer")
    known = {**DEFAULT_PROMPTS, **saved.prompts}  # sentence-transformers 6 gives every model "query" and "document"
    if saved.default_prompt_name is not None and saved.default_prompt_name not in known:
        raise BertkitError(f"{saved.path / ST_CONFIG}: default_prompt_name {saved.default_prompt_name!r} is not one "
                           f"of its prompts {sorted(known)}, so sentence-transformers refuses to load it: add that "
                           "prompt to prompts there, or set default_prompt_name to null")
    return saved


def prompt_named(prompts: Mapping[str, str], prompt_name: str) -> str:
    """``prompts[prompt_name]`` of a sentence-transformers directory, or an error naming the prompts it has:
    "query" and "document" are every model's, empty unless the directory sets them, as sentence-transformers 6 (and
    ``SentenceTransformer.encode``) has them; a prompt written as null is empty there too."""
    prompts = {**{name: "" for name in DEFAULT_PROMPTS}, **prompts}
    if prompt_name not in prompts:
        raise BertkitError(f"prompt_name {prompt_name!r} is not one of this model's prompts: "
                           f"{', '.join(map(repr, prompts))}")
    return prompts[prompt_name] or ""


class FeatureExtractionPipeline(TextOrPairPipeline):
    """A text (or ``(text, text_pair)``) -> its embedding, a list of floats.

    ``pooling="mean"`` averages the last layer's token states over the real tokens ([CLS] and [SEP]
    included, as sentence-transformers does), ``"cls"`` takes [CLS]'s state, ``"max"``, ``"mean_sqrt_len_tokens"``,
    ``"weightedmean"`` and ``"lasttoken"`` are sentence-transformers' other single modes, ``"none"`` returns every
    token's state (a list per token). ``truncate_dim`` keeps a vector's first dimensions (Matryoshka), then
    ``normalize=True`` scales it to unit L2 norm (cosine similarity becomes a dot product): encode's
    ``normalize_embeddings``. Pooling runs on the encoder's unpadded tokens.

    A sentence-transformers directory (``directory``, as ``from_pretrained`` reads it) gives what its model's
    ``encode`` gives: its 1_Pooling's modes (concatenated), its max_seq_length as ``max_length``, its truncate_dim,
    its default prompt before each text (left out of the pooling where 1_Pooling says so), its do_lower_case, and its
    Normalize module, part of the model as in sentence-transformers: it scales the pooled vector before truncate_dim
    keeps its first dimensions (so a truncated vector is not unit-length unless ``normalize`` asks;
    ``normalize=False`` does not undo it, as ``normalize_embeddings=False`` does not). Any other argument given
    explicitly wins (``default_prompt_name``: the prompt put before a text whose call names none, as
    ``SentenceTransformer(default_prompt_name=...)``). Left unset, another checkpoint pools by the mean.
    """

    task = tasks.FeatureExtraction.name
    model_class = BertModel
    default_normalize = False
    # read where it is used (``prompt_named``: "query" and "document" are every model's, as sentence-transformers 6
    # has them); bertkit serve takes what TEI does, the prompts its /info lists
    call_options = (Option("prompt_name", served=lambda pipe: None if not pipe.prompts else (
        lambda v: isinstance(v, str) and v in pipe.prompts,
        f"one of this model's prompts (/info's prompts: {', '.join(map(repr, pipe.prompts))}), or null for the default "
        "prompt")),)
    instead_of = {"return_tensors": "results are lists of floats (torch.tensor(result) makes one); transformers' "
                                    "per-token output, [CLS] and [SEP] included, is pipeline(\"feature-extraction\", "
                                    "model, pooling=\"none\")"}

    def __init__(self, model, tokenizer, *, pooling: str | None = None, normalize: bool | None = None,
                 truncate_dim: int | None = None, default_prompt_name: str | None = None,
                 directory: SentenceDirectory | None = None, **kwargs: Any):
        saved = directory if directory is not None else SentenceDirectory(Path(), Path())  # a model object: defaults
        # the directory's modes, several concatenated in their order as its model's Pooling does, unless one is asked
        modes = (pooling,) if pooling else saved.pooling.modes if saved.pooling is not None else ("mean",)
        if pooling is not None and pooling not in POOLINGS:
            raise BertkitError(f"pooling {pooling!r} is not one of {POOLINGS}")
        if kwargs.get("max_length") is None:
            kwargs["max_length"] = saved.max_seq_length
        super().__init__(model, tokenizer, **kwargs)
        self.modes = modes
        self.pooling = modes[0] if len(modes) == 1 else list(modes)  # what /info says, as 1_Pooling's pooling_mode
        normalize = checked_flag("normalize", normalize, "None: the task's default")
        self.normalize = self.default_normalize if normalize is None else normalize
        self.normalize_module = saved.normalize  # 2_Normalize: before truncate_dim, as the model's own forward
        width = model.config.hidden_size * len(modes)
        truncate_dim = saved.truncate_dim_within(width) if truncate_dim is None else truncate_dim
        if truncate_dim is not None and not is_whole(truncate_dim, 1, width):
            raise BertkitError(f"truncate_dim {truncate_dim!r} must be a whole number in [1, {width}] (the width of "
                               "the pooled vector)")
        self.truncate_dim = truncate_dim
        self.lowercase, self.prompts = saved.do_lower_case, saved.prompts
        self.default_prompt_name, self.prompt = saved.default_prompt_name, saved.default_prompt or ""
        if default_prompt_name is not None:  # SentenceTransformer(default_prompt_name=...): the directory's is replaced
            self.default_prompt_name, self.prompt = default_prompt_name, prompt_named(self.prompts, default_prompt_name)
        self.include_prompt = saved.pooling is None or saved.pooling.include_prompt
        self._prompt_lengths: dict[str, int] = {}  # prompt -> its tokens the pooling leaves out (left_out)

    @property
    def dimension(self) -> int:
        """The width of the vectors this pipeline returns (every token's, for pooling "none")."""
        width = self.config.hidden_size * (1 if self.pooling == "none" else len(self.modes))
        return width if self.pooling == "none" or self.truncate_dim is None else self.truncate_dim

    @classmethod
    def from_pretrained(cls, model_dir: str | Path, **kwargs: Any) -> Pipeline:
        saved = sentence_directory(Path(model_dir))
        asked = kwargs.get("pooling")
        if saved.pooling is not None and asked not in (None, "none") and (asked,) != saved.pooling.modes:
            modes = saved.pooling.modes
            declared = modes[0] if len(modes) == 1 else list(modes)
            logger.warning("%s pools by %r (1_Pooling); pooling=%r was asked for, so its vectors are not the "
                           "model's sentence embeddings", model_dir, declared, asked)
        return super().from_pretrained(saved.encoder_dir, directory=saved, **kwargs)

    @classmethod
    def tokenizer_of(cls, model_dir: str | Path) -> BertTokenizer:
        # the encoder's directory: 0_Transformer/ in sentence-transformers' older layout
        return super().tokenizer_of(sentence_directory(Path(model_dir)).encoder_dir)

    @property
    def prompt_ids(self) -> list[int]:
        """The default prompt's token ids, which follow [CLS] in every text's row (none without a prompt)."""
        prompt = self.tokenizer.lowercase(self.prompt) if self.lowercase else self.prompt
        return self.tokenizer(prompt, add_special_tokens=False)["input_ids"] if prompt else []

    @classmethod
    def directory_prompt(cls, model_dir: str | Path, prompt_name: str) -> str:
        """The prompt ``prompt_name`` names in a sentence-transformers directory, read from its files without the
        weights (``bertkit predict`` checks --prompt-name with it before the model loads)."""
        return prompt_named(sentence_directory(Path(model_dir)).prompts, prompt_name)

    def text_form(self, prompt_name: str | None) -> tuple[str, bool, bool]:
        """The prompt put before each text, ``prompts[prompt_name]`` or the default prompt when it is None (as
        ``encode(prompt_name=...)`` chooses in sentence-transformers), the directory's do_lower_case, and [CLS] and
        [SEP] around the text, as its Transformer reads it."""
        return self.prompt if prompt_name is None else prompt_named(self.prompts, prompt_name), self.lowercase, True

    def encode(self, item: tuple[str, str | None], prompt_name: str | None = None,
               **options: Any) -> list[dict[str, Any]]:
        prompt, lowercase, _ = self.text_form(prompt_name)
        text, pair = prompt + item[0], item[1]
        if lowercase:  # sentence_bert_config.json's do_lower_case, as sentence-transformers applies it
            lower = self.tokenizer.lowercase
            text, pair = lower(text), lower(pair) if pair is not None else None
        return [self.left_out(row, prompt) for row in super().encode((text, pair), **options)]

    def left_out(self, row: dict[str, Any], prompt: str) -> dict[str, Any]:
        """``row`` of a text after ``prompt``, with the number of its leading tokens the pooling leaves out
        (``prompt_length``: [CLS] and the prompt's, where 1_Pooling's include_prompt is false)."""
        if prompt and not self.include_prompt:
            if prompt not in self._prompt_lengths:  # tokenized once a prompt, not once a text
                lowered = self.tokenizer.lowercase(prompt) if self.lowercase else prompt
                self._prompt_lengths[prompt] = prompt_tokens(self.tokenizer, lowered, self.max_length)
            row["prompt_length"] = self._prompt_lengths[prompt]
        return row

    def forward(self, batch, rows) -> list[np.ndarray]:
        out = self.model(batch["input_ids"], batch["attention_mask"], batch["token_type_ids"])
        tokens = self.pooling == "none" or rows[0].get("all_tokens", False)  # a batch's rows share it (base._group)
        if tokens:
            v = out.token_layout.to_batch(readable(out.tokens))  # (B, T, H)
        else:
            # (B, H x modes): sentence-transformers' Pooling (and Normalize), then its truncate_dim; the rows of a batch
            # share their prompt's length (run_rows batches rows of other lengths apart)
            skip = rows[0].get("prompt_length", 0)
            v = torch.cat([pool_tokens(out.tokens, out.token_layout, batch["attention_mask"], m, skip)
                           for m in self.modes], dim=-1)
            if self.normalize_module:
                v = unit_length(v)
            v = v[:, :self.dimension]
        if self.normalize:
            v = unit_length(v)
        return per_row(v, rows) if tokens else list(readable(v).cpu().numpy())

    def decode(self, item, rows, outputs, **_: Any) -> list[float] | list[list[float]]:
        return outputs[0].tolist()


class SentenceEmbeddingPipeline(FeatureExtractionPipeline):
    """``feature-extraction`` with unit-normalised vectors by default (sentence-transformers' models)."""

    task = tasks.SentenceEmbedding.name
    default_normalize = True
