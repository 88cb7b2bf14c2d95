"""Pooling: token states -> one vector per text, as sentence-transformers' ``Pooling`` module (1_Pooling).

Modes "mean", "cls", "max", "mean_sqrt_len_tokens", "weightedmean" and "lasttoken", several concatenated in the order
given. ``pool_tokens`` reads token states in whichever layout the encoder computed them (``TokenLayout``): on the
unpadded layout the mean is a scatter-add over the real tokens only. A model's ``Pooling`` module reads the features'
(B, T, H) ``token_embeddings``, as sentence-transformers' does.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from bertkit.errors import BertkitError
from bertkit.padding import TokenLayout, moved
from bertkit.sentence.calls import check_features

MODES = ("cls", "max", "mean", "mean_sqrt_len_tokens", "weightedmean", "lasttoken")
# sentence-transformers' older 1_Pooling/config.json keys, in the order its Pooling concatenates them
_LEGACY_KEYS = {"pooling_mode_cls_token": "cls", "pooling_mode_max_tokens": "max",
                "pooling_mode_mean_tokens": "mean", "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
                "pooling_mode_weightedmean_tokens": "weightedmean", "pooling_mode_lasttoken": "lasttoken"}


def pool_tokens(tokens: Tensor, lay: TokenLayout, attention_mask: Tensor, mode: str, prompt_length: int = 0) -> Tensor:
    """(B, H) float32 (float64 from a float64 encoder): ``mode`` pooling of the token states ``tokens`` (stored in the
    layout ``lay``: an encoder output's ``tokens`` and ``token_layout``) over the real tokens of ``attention_mask``
    (B, T), leaving out the first ``prompt_length`` positions (a prompt not to be pooled)."""
    x = tokens.to(torch.promote_types(tokens.dtype, torch.float32))
    B, T = attention_mask.shape
    if mode == "cls":
        if not prompt_length:
            return lay.first_tokens(x)
        # the first token after the prompt; a text the prompt takes whole (its first word merged with the prompt's
        # last into fewer pieces: "quest" + "ion") pools its [CLS], as sentence-transformers' argmax over a row of
        # zeros picks it
        first = torch.where(attention_mask.sum(1) > prompt_length, prompt_length, 0)  # (B,)
        return lay.to_batch(x)[torch.arange(B, device=x.device), first]
    mask = attention_mask.to(x.dtype)
    if prompt_length:
        mask = mask.clone()
        mask[:, :prompt_length] = 0
    if mode == "max":
        return lay.to_batch(x).masked_fill(mask.unsqueeze(-1) == 0, float("-inf")).max(dim=1).values
    if mode == "lasttoken":
        # the last pooled token ([SEP] for a BERT text); a row the prompt takes whole gives zeros, as
        # sentence-transformers multiplies the token it gathers by the mask there
        last = T - 1 - mask.flip(1).argmax(1)  # (B,)
        rows = torch.arange(B, device=x.device)
        return lay.to_batch(x)[rows, last] * mask[rows, last].unsqueeze(-1)
    if mode == "weightedmean":
        # token i (from 1) weighs i, positions counted from [CLS] with the prompt's included, as there
        weights = mask * torch.arange(1, T + 1, device=x.device, dtype=x.dtype)  # (B, T)
        summed = (lay.to_batch(x) * weights.unsqueeze(-1)).sum(1)  # (B, H)
        return summed / weights.sum(1, keepdim=True).clamp(min=1e-9)
    if lay.is_padded:
        summed = (x * mask.unsqueeze(-1)).sum(1)  # (B, H)
    else:
        weights = mask.reshape(-1)[lay.flat_index].unsqueeze(-1)  # (N, 1): 0 on prompt tokens
        summed = x.new_zeros(B, x.size(-1)).index_add_(0, lay.flat_index // T, x * weights)  # (B, H)
    count = mask.sum(1, keepdim=True).clamp(min=1e-9)  # (B, 1)
    return summed / (count if mode == "mean" else count.sqrt())


def _checked_modes(modes: Any, where: str) -> tuple[str, ...]:
    """``modes`` (a mode's name or several) as the tuple pooling concatenates, each one bertkit implements."""
    modes = (modes,) if isinstance(modes, str) else tuple(modes)
    if not modes:  # sentence-transformers fails at the first encode (torch.cat of no poolings)
        raise BertkitError(f"{where}: pooling_mode [] names no mode; list one or more of {MODES}")
    refused = [m for m in modes if m not in MODES]
    if refused:
        raise BertkitError(f"{where}: pooling {refused} is not implemented in bertkit (it pools with {MODES}); "
                           "use sentence-transformers for this model")
    return modes


class Pooling(nn.Module):
    """What 1_Pooling/config.json says: the modes (concatenated), the width of the token states, and whether a
    prompt's tokens are pooled. A model's ``model[1]``: setting ``include_prompt`` or ``pooling_mode`` changes what it
    pools, as sentence-transformers' Pooling does."""

    def __init__(self, embedding_dimension: int, modes: tuple[str, ...] = ("mean",), include_prompt: bool = True):
        super().__init__()
        self.embedding_dimension, self.modes, self.include_prompt = embedding_dimension, modes, include_prompt

    def __setattr__(self, name: str, value: Any) -> None:
        # (nn.Module's own attributes, training among them, are in __dict__ once its __init__ has run)
        if name not in ("embedding_dimension", "modes", "include_prompt", "pooling_mode", "qconfig", *self.__dict__):
            # kept, it would be a setting pooling never reads
            raise BertkitError(f"Pooling.{name} is not a setting of bertkit's Pooling; it takes pooling_mode and "
                               "include_prompt")
        if name == "modes":
            value = _checked_modes(value, "Pooling.pooling_mode")
        elif name == "include_prompt":
            value = bool(value)
        super().__setattr__(name, value)

    @classmethod
    def from_config(cls, config: dict[str, Any], where: str) -> Pooling:
        mode = config.get("pooling_mode")
        if mode is not None and not (isinstance(mode, str) or isinstance(mode, list)
                                     and all(isinstance(m, str) for m in mode)):
            raise BertkitError(f"{where}: pooling_mode {mode!r} must be a mode's name or a list of them, from {MODES}")
        # the legacy booleans set, in sentence-transformers' order (none set: the mean)
        modes = _checked_modes(mode if mode is not None else
                               [name for key, name in _LEGACY_KEYS.items() if config.get(key)] or "mean", where)
        dim = config.get("embedding_dimension", config.get("word_embedding_dimension"))
        if dim is None:
            raise BertkitError(f"{where} has no embedding_dimension; write the encoder's hidden_size there")
        return cls(int(dim), modes, bool(config.get("include_prompt", True)))

    def to_config(self) -> dict[str, Any]:
        """The legacy booleans every sentence-transformers reads, and where they cannot say the modes (another order
        than theirs, a mode twice), pooling_mode, which sentence-transformers 6 reads before them: concatenated in
        another order, the same model's vectors would come back with their parts swapped."""
        legacy = {key: name in self.modes for key, name in _LEGACY_KEYS.items()}
        in_legacy_order = tuple(name for name in _LEGACY_KEYS.values() if name in self.modes)
        return {"word_embedding_dimension": self.embedding_dimension, **legacy,
                **({} if in_legacy_order == self.modes else {"pooling_mode": list(self.modes)}),
                "include_prompt": self.include_prompt}

    @property
    def output_dimension(self) -> int:
        return self.embedding_dimension * len(self.modes)

    pooling_output_dimension = output_dimension  # sentence-transformers' names for what model[1] holds

    @property
    def pooling_mode(self) -> str | tuple[str, ...]:
        """The mode, or the modes concatenated (a tuple), as sentence-transformers 6's Pooling holds them."""
        return self.modes[0] if len(self.modes) == 1 else self.modes

    @pooling_mode.setter
    def pooling_mode(self, value: str | list[str] | tuple[str, ...]) -> None:
        self.modes = value  # type: ignore[assignment]  # a mode's name or a list, checked and kept as a tuple

    def get_embedding_dimension(self) -> int:  # sentence-transformers' module method
        return self.output_dimension

    def __repr__(self) -> str:  # sentence-transformers 6's: its config's keys
        settings = {"embedding_dimension": self.embedding_dimension, "pooling_mode": self.pooling_mode,
                    "include_prompt": self.include_prompt}
        return f"Pooling({settings})"

    get_sentence_embedding_dimension = get_embedding_dimension  # its name before 6

    def forward(self, features: dict[str, Any]) -> dict[str, Any]:
        """sentence-transformers' Pooling.forward (``model[1](features)``): ``sentence_embedding`` (B, D) added to the
        features, in place, and returned: the modes' pooling of ``token_embeddings`` (B, T, H) over the real tokens of
        ``attention_mask``, in the token states' type (accumulated in float32). Without ``include_prompt``, the
        features' ``prompt_length`` leading tokens (an int, or a tensor of one repeated value, as a collated batch
        carries it) are left out, as there."""
        check_features(features, ("token_embeddings", "attention_mask"), "model[0](model.tokenize(texts))",
                       "model[1](features)")
        x = features["token_embeddings"]  # (B, T, H)
        skip, given = 0, features.get("prompt_length")
        if not self.include_prompt and given is not None:
            skip = int(given.reshape(-1)[0]) if isinstance(given, Tensor) else int(given)
        mask = moved(features["attention_mask"], x.device)  # a batch's mask may still be on the host
        lay = TokenLayout.padded(None, (x.size(0), x.size(1)))  # the rectangle as given: ``mask`` says what is real
        parts = [pool_tokens(x, lay, mask, m, skip) for m in self.modes]
        features["sentence_embedding"] = (parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)).to(x.dtype)
        return features
