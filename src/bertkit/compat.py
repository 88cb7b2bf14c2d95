"""transformers' object habits, kept out of the forward pass: output access and the tied MLM decoder.

Code written for transformers indexes outputs (``out[0]``, ``out["logits"]``, ``out.keys()``). Module paths
need nothing here: bertkit's modules carry transformers' names (``model.bert.encoder.layer[i]``).
"""

from __future__ import annotations

import numbers
from collections.abc import Iterator
from typing import Any, ClassVar

import torch
from torch import nn

from bertkit.config import BertConfig
from bertkit.errors import BertkitError, no_hub


class TupleAccess:
    """transformers' ``ModelOutput`` habits (``out[0]``, ``out["logits"]``, ``to_tuple()``, ``keys()``): the
    fields transformers' output class has, in its order, those that are None left out."""

    tuple_fields: ClassVar[tuple[str, ...]] = ()

    def keys(self) -> list[str]:
        return [f for f in self.tuple_fields if getattr(self, f) is not None]

    def values(self) -> list[Any]:
        return [getattr(self, f) for f in self.keys()]

    def items(self) -> list[tuple[str, Any]]:
        return [(f, getattr(self, f)) for f in self.keys()]

    def get(self, key: str, default: Any = None) -> Any:
        """``out.get("logits")``, as transformers' documented custom ``compute_loss`` reads it: a field that is None
        is no key there, so ``default``."""
        return getattr(self, key) if key in self.keys() else default

    def to_tuple(self) -> tuple[Any, ...]:
        return tuple(self.values())

    def __getitem__(self, key: int | slice | str) -> Any:
        if isinstance(key, str):
            if key not in self.tuple_fields:
                raise KeyError(f"{key!r}: this output has {', '.join(self.tuple_fields)}")
            return getattr(self, key)
        return self.to_tuple()[key]

    def __contains__(self, key: object) -> bool:
        return key in self.keys()

    def __iter__(self) -> Iterator[str]:
        return iter(self.keys())  # as a dict (transformers' ModelOutput is an OrderedDict)

    def __len__(self) -> int:
        return len(self.keys())


def returns_dataclass(config_return_dict: bool, return_dict: bool | None) -> bool:
    """Whether a forward returns its output dataclass: ``return_dict`` if given, else the config's default, but the
    tuple while ``torch.jit.trace`` (or the TorchScript ONNX exporter) records the call: the tracer takes tensors and
    tuples only (transformers 4's ``torchscript=True`` gave the tuple; transformers 5 needs ``strict=False``)."""
    if return_dict is not None:
        return return_dict
    return config_return_dict and not torch.jit.is_tracing()


def tied_output_embeddings(word_embeddings: nn.Embedding, bias: nn.Parameter) -> nn.Linear:
    """The MLM decoder: a ``Linear(H, V)`` whose weight *is* the word-embedding matrix and whose bias is the
    head's output bias (tied, as google-research/bert ties them); it holds no copy."""
    linear = nn.Linear.__new__(nn.Linear)
    nn.Module.__init__(linear)
    linear.in_features, linear.out_features = word_embeddings.embedding_dim, word_embeddings.num_embeddings
    linear.weight, linear.bias = word_embeddings.weight, bias
    return linear


ATTN_IMPLEMENTATIONS = ("sdpa", "eager")


def check_attn_implementation(name: str) -> None:
    """Refuse an attention implementation bertkit does not have (transformers' ``flash_attention_2``, ...)."""
    if name not in ATTN_IMPLEMENTATIONS:
        raise BertkitError(f"attn_implementation {name!r} is not available in bertkit; use 'sdpa' (the default: "
                           "PyTorch's fused attention, padding skipped) or 'eager' (attention written out, as "
                           "transformers' eager)")


class TransformersModelCalls:
    """The model methods people port from transformers (``num_parameters``, ``resize_token_embeddings``,
    ``gradient_checkpointing_enable``, ``device``, ...), for ``PretrainedMixin``'s models."""

    main_input_name: ClassVar[str] = "input_ids"  # the input transformers' Trainer, pipelines and peft size batches by
    supports_gradient_checkpointing: ClassVar[bool] = True  # peft and Trainer read it before enabling it
    base_model_prefix: ClassVar[str] = "bert"  # the encoder's attribute in a head model, as transformers names it
    config_class: ClassVar[type[BertConfig]] = BertConfig  # ``model.config_class.from_pretrained(path)``

    @classmethod
    def can_generate(cls) -> bool:
        """False: an encoder has no ``generate`` (transformers' pipelines and scripts ask before calling it)."""
        return False

    def push_to_hub(self, *args: Any, **kwargs: Any) -> None:
        """Refused naming the fix (``no_hub``): transformers' method uploads, and bertkit reaches no hub."""
        raise no_hub(self)

    def set_attn_implementation(self, attn_implementation: str) -> None:
        """transformers 5's switch after loading: ``"sdpa"`` (default) or ``"eager"`` (``from_pretrained``'s
        ``attn_implementation=``); the outputs are the same either way."""
        check_attn_implementation(attn_implementation)
        self._encoder().attn_implementation = attn_implementation

    def get_memory_footprint(self, return_buffers: bool = True) -> int:
        """Bytes held by the parameters (and buffers), as transformers counts them; a tied weight once."""
        tensors = [*self.parameters(), *(self.buffers() if return_buffers else ())]  # type: ignore[attr-defined]
        return sum(t.numel() * t.element_size() for t in tensors)

    @property
    def base_model(self):
        """The encoder (``BertModel``): ``self`` for a ``BertModel``, ``self.bert`` for a head model."""
        return self._encoder()

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """Parameter count, as transformers counts it (a tied weight once; ``exclude_embeddings`` leaves out the
        embedding matrices, not the embeddings' LayerNorm)."""
        modules = self.modules() if exclude_embeddings else ()  # type: ignore[attr-defined]
        skip = {id(m.weight) for m in modules if isinstance(m, nn.Embedding)}
        return sum(p.numel() for p in self.parameters()  # type: ignore[attr-defined]
                   if id(p) not in skip and (p.requires_grad or not only_trainable))

    def _mlm_head(self):
        return getattr(getattr(self, "cls", None), "predictions", None)

    def get_output_embeddings(self) -> torch.nn.Linear | None:
        """The MLM decoder, tied to the word embeddings (its weight *is* theirs); None without an MLM head."""
        mlm = self._mlm_head()
        return None if mlm is None else mlm.decoder

    @property
    def device(self) -> torch.device:
        """Where the weights are (the word embeddings' device)."""
        return self.get_input_embeddings().weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.get_input_embeddings().weight.dtype

    def get_input_embeddings(self) -> torch.nn.Embedding:
        return self._encoder().embeddings.word_embeddings

    def set_input_embeddings(self, embeddings: torch.nn.Embedding) -> None:
        """Replace the word embeddings (the tied MLM decoder reads them); ``config.vocab_size`` follows their rows."""
        if embeddings.embedding_dim != self.config.hidden_size:
            raise BertkitError(f"embeddings have dim {embeddings.embedding_dim}, the model hidden_size "
                               f"{self.config.hidden_size}")
        mlm = self._mlm_head()
        if mlm is not None and mlm.bias.numel() != embeddings.num_embeddings:
            raise BertkitError(f"embeddings have {embeddings.num_embeddings} rows but the MLM bias "
                               f"{mlm.bias.numel()}: use resize_token_embeddings to change the vocabulary size")
        self._use_word_embeddings(embeddings)

    def resize_token_embeddings(self, new_num_tokens: int | None = None, pad_to_multiple_of: int | None = None,
                                mean_resizing: bool = True) -> torch.nn.Embedding:
        """Grow (or shrink) the vocabulary to ``new_num_tokens`` rows (e.g. ``len(tokenizer)``); returns the word
        embeddings. New rows are transformers', drawn from torch's global generator as it draws them, so a seed gives
        the same rows and the same random numbers afterwards (dropout, a head's init): with ``mean_resizing`` (its
        default) from a normal of the old rows' mean and 1e-9 times their covariance, else the whole new matrix from
        N(0, ``initializer_range``) and the old rows copied back. The MLM bias is zero for the new tokens (as
        transformers leaves it); ``config.vocab_size`` follows."""
        if not isinstance(mean_resizing, bool):
            raise BertkitError(f"mean_resizing={mean_resizing!r}: pass True (new rows around the old rows' mean) or "
                               "False (drawn from N(0, initializer_range))")
        for name, value in (("new_num_tokens", new_num_tokens), ("pad_to_multiple_of", pad_to_multiple_of)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1):
                hint = " (the tokenizer's size: len(tokenizer))" if name == "new_num_tokens" else ""
                raise BertkitError(f"{name} must be a positive int, got {value!r}{hint}")
        old = self.get_input_embeddings()
        n = old.num_embeddings if new_num_tokens is None else int(new_num_tokens)
        if pad_to_multiple_of is not None:
            n = -(-n // pad_to_multiple_of) * pad_to_multiple_of
        if self.config.pad_token_id is not None and not self.config.pad_token_id < n:
            raise BertkitError(f"a vocabulary of {n} tokens does not hold pad_token_id {self.config.pad_token_id}")
        if n == old.num_embeddings:
            return old
        # nn.Embedding's own init draws (n, H) normals first, as transformers' new nn.Embedding does
        new = torch.nn.Embedding(n, old.embedding_dim, padding_idx=old.padding_idx, device=old.weight.device,
                                 dtype=old.weight.dtype)
        keep = min(n, old.num_embeddings)
        with torch.no_grad():
            if n > keep and mean_resizing:
                new.weight[keep:] = _rows_around_mean(old.weight, n - keep)
            elif n > keep:
                new.weight.normal_(0.0, self.config.initializer_range or 0.02)
            new.weight[:keep] = old.weight[:keep]
        new.weight.requires_grad_(old.weight.requires_grad)
        self._use_word_embeddings(new, resize_mlm_bias=True)
        return new

    def _use_word_embeddings(self, embeddings: torch.nn.Embedding, resize_mlm_bias: bool = False) -> None:
        """Swap in ``embeddings`` (the MLM bias cut or zero-extended to their rows with ``resize_mlm_bias``), tie
        the MLM decoder to them again, and set ``config.vocab_size`` to their rows."""
        n = embeddings.num_embeddings
        if self.config.pad_token_id is not None and not self.config.pad_token_id < n:
            raise BertkitError(f"a vocabulary of {n} tokens does not hold pad_token_id {self.config.pad_token_id}")
        self._encoder().embeddings.word_embeddings = embeddings
        if (mlm := self._mlm_head()) is not None:
            if resize_mlm_bias:
                bias = torch.zeros(n, device=mlm.bias.device, dtype=mlm.bias.dtype)
                bias[:min(n, mlm.bias.numel())] = mlm.bias.detach()[:n]
                mlm.bias = torch.nn.Parameter(bias, requires_grad=mlm.bias.requires_grad)
            mlm.tie(embeddings)
        self.config.vocab_size = n
        if self._encoder().config is not self.config:
            self._encoder().config.vocab_size = n

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict[str, Any] | None = None) -> None:
        """Recompute each layer in the backward pass: the encoder's ``gradient_checkpointing`` switch, the one
        ``--gradient-checkpointing`` sets. Always non-reentrant, so ``use_reentrant=True`` is refused."""
        kwargs = dict(gradient_checkpointing_kwargs or {})
        if kwargs.pop("use_reentrant", False) or kwargs:
            raise BertkitError(f"gradient_checkpointing_kwargs {gradient_checkpointing_kwargs} not supported: bertkit "
                               "always checkpoints non-reentrantly (use_reentrant=False) and takes no other options")
        self._encoder().gradient_checkpointing = True

    def enable_input_require_grads(self) -> None:
        """The word embeddings' output requires grad even where they are frozen (peft's adapters), as transformers'
        method does: reentrant checkpointing needs it; bertkit's non-reentrant one does not, so this keeps ported
        calls (peft's ``prepare_model_for_kbit_training``) working and changes no gradient."""
        self.disable_input_require_grads()
        self._input_grads_hook = self.get_input_embeddings().register_forward_hook(
            lambda module, args, output: output.requires_grad_(True))

    def disable_input_require_grads(self) -> None:
        hook = self.__dict__.pop("_input_grads_hook", None)
        if hook is not None:
            hook.remove()

    def gradient_checkpointing_disable(self) -> None:
        self._encoder().gradient_checkpointing = False

    @property
    def is_gradient_checkpointing(self) -> bool:
        return self._encoder().gradient_checkpointing


def _rows_around_mean(weight: torch.Tensor, count: int) -> torch.Tensor:
    """``count`` rows drawn as transformers' ``mean_resizing`` draws them (Hewitt, "Initializing new word embeddings
    for pretrained language models"): from a normal with the rows' mean and 1e-9 times their covariance, so that a new
    token changes no output distribution much; the mean itself where that covariance is not positive definite."""
    rows = weight.detach().float()
    mean = rows.mean(0)
    centered = rows - mean
    covariance = 1e-9 * (centered.T @ centered / rows.shape[0])
    if not torch.distributions.constraints.positive_definite.check(covariance).all():
        return mean.expand(count, -1).to(weight.dtype)
    normal = torch.distributions.MultivariateNormal(mean, covariance_matrix=covariance)
    return normal.sample((count,)).to(weight.dtype)
