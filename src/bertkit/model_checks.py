"""Checks on a model's inputs and environment, kept out of the forward pass (``modeling.py``) they guard.

Shapes, dtypes and id ranges are checked where inputs enter, so a mistake is a clear error naming the value
and the fix, not torch's "index out of range in self" or wrong outputs from a broadcast mask.
"""

from __future__ import annotations

import errno
import os
import re
from typing import Any

import torch
from torch import Tensor

from bertkit.config import BertConfig, encoder_parameter_count
from bertkit.errors import BertkitError
from bertkit.outputs import read_only_mount
from bertkit.padding import is_tracing

# BERT's tokenizer gives a pair's second text token type 1 (paper, section 3, "segment B"), and a model with one row in
# its token-type table has no embedding for it: transformers fails there with "index out of range in self". The input
# did come from this model's tokenizer, so the range message's question would point the wrong way.
_ONE_TOKEN_TYPE = (
    "token_type_ids holds 1 (a text pair's second text), and this model has one token type (type_vocab_size 1 in its "
    "config.json), so it reads single texts only: it has no embedding for a pair's second segment. Pass single texts "
    "(join a pair into one text), or use a checkpoint with type_vocab_size 2 for pairs (text pairs, question "
    "answering, multiple choice, cross-encoders)")


def require_tensors(**given: Any) -> None:
    """Each of ``given`` (inputs and labels of a forward pass) that is not None is a torch tensor: a list or numpy
    array was an AttributeError from inside the model ("'list' object has no attribute 'dim'"), as transformers' is."""
    for name, value in given.items():
        if value is not None and not isinstance(value, Tensor):
            raise BertkitError(f"{name} must be a torch tensor, got {type(value).__name__} {str(value)[:40]}: pass "
                               f"torch.tensor({name}) (a tokenizer call with return_tensors='pt' gives tensors)")


def check_inputs(config: BertConfig, input_ids: Tensor | None, token_type_ids: Tensor | None,
                 attention_mask: Tensor | None, position_ids: Tensor | None,
                 inputs_embeds: Tensor | None = None, rows: tuple[int, int, int] | None = None) -> tuple[int, int]:
    """Shapes and id ranges, one min/max pass per tensor (skipped while tracing: values are symbolic). Returns (B, T).
    ``rows``: the rows of the word, token-type and position tables the ids index (default: the config's sizes)."""
    require_tensors(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids,
                    position_ids=position_ids, inputs_embeds=inputs_embeds)
    if (input_ids is None) == (inputs_embeds is None):
        raise BertkitError("pass exactly one of input_ids (B, T) and inputs_embeds (B, T, H)")
    if inputs_embeds is not None:
        if inputs_embeds.dim() != 3 or inputs_embeds.shape[-1] != config.hidden_size:
            raise BertkitError(f"inputs_embeds must be (batch, seq_len, hidden_size={config.hidden_size}), "
                               f"got shape {tuple(inputs_embeds.shape)}")
        shape = tuple(inputs_embeds.shape[:2])
    elif input_ids.dim() != 2:
        raise BertkitError(f"input_ids must be (batch, seq_len), got shape {tuple(input_ids.shape)}")
    else:
        shape = tuple(input_ids.shape)
    given = {name: t for name, t in (("input_ids", input_ids), ("attention_mask", attention_mask),
                                     ("token_type_ids", token_type_ids), ("position_ids", position_ids),
                                     ("inputs_embeds", inputs_embeds)) if t is not None}
    if len({t.device for t in given.values()}) > 1:
        where = ", ".join(f"{name} on {t.device}" for name, t in given.items())
        raise BertkitError(f"the inputs are on different devices ({where}); pass them all on the host or all on the "
                           "model's device (a model on a GPU takes a batch on the host too)")
    for name, t in (("input_ids", input_ids), ("token_type_ids", token_type_ids), ("position_ids", position_ids)):
        if t is not None and (t.is_floating_point() or t.is_complex() or t.dtype == torch.bool):
            raise BertkitError(f"{name} must hold integer ids (torch.long), got dtype {t.dtype}; convert with "
                               f".long() (the tokenizer's return_tensors='pt' gives long ids)")
    if not is_tracing() and shape[1] == 0:
        raise BertkitError(f"the sequences are empty (shape {shape}): every input needs at least one token "
                           "(the tokenizer adds [CLS] and [SEP])")
    for name, t in (("attention_mask", attention_mask), ("token_type_ids", token_type_ids)):
        if t is not None and tuple(t.shape) != shape:
            raise BertkitError(f"{name} has shape {tuple(t.shape)} but input_ids has {shape}; pass one value per "
                               "token (the tokenizer's output with padding=True gives matching shapes)")
    # (T,) too, as transformers broadcasts it over the batch (the model expands it as it expands (1, T))
    if position_ids is not None and tuple(position_ids.shape) not in (shape, (1, shape[1]), (shape[1],)):
        raise BertkitError(f"position_ids has shape {tuple(position_ids.shape)}; expected {shape}, (1, {shape[1]}) "
                           f"or ({shape[1]},)")
    if is_tracing() or shape[0] == 0:
        return shape
    vocab, types, positions = rows or (config.vocab_size, config.type_vocab_size, config.max_position_embeddings)
    ranges = [(name, t, limit, what) for name, t, limit, what in (
        ("input_ids", input_ids, vocab, "vocab_size"),
        ("token_type_ids", token_type_ids, types, "type_vocab_size"),
        ("position_ids", position_ids, positions, "max_position_embeddings")) if t is not None]
    # Every range and the mask's values in one read back: on a GPU each read back waits for the queued kernels.
    parts = [v.long().view(1) for _, t, _, _ in ranges for v in torch.aminmax(t)]
    if attention_mask is not None and attention_mask.dtype != torch.bool and not attention_mask.is_complex():
        parts.append(torch.any(attention_mask * (attention_mask - 1)).long().view(1))
    values = torch.cat(parts).tolist() if parts else []
    for i, (name, _, limit, what) in enumerate(ranges):
        lo, hi = values[2 * i], values[2 * i + 1]
        if lo < 0 or hi >= limit:
            bad = lo if lo < 0 else hi
            if name == "token_type_ids" and limit == 1 and bad == 1:
                raise BertkitError(_ONE_TOKEN_TYPE)
            # ids past the rows are, most often, tokens added to the tokenizer after the model was loaded
            grown = (" (after tokenizer.add_tokens or add_special_tokens, grow the model to the tokenizer with "
                     "model.resize_token_embeddings(len(tokenizer)))") if name == "input_ids" and bad > 0 else ""
            raise BertkitError(f"{name} holds {bad}, outside [0, {limit - 1}] ({what} {limit} of this model); "
                               f"was the input made with this model's tokenizer?{grown}")
    if attention_mask is not None and (attention_mask.is_complex() or (len(values) > 2 * len(ranges) and values[-1])):
        check_mask_values(attention_mask)  # names the value
    return shape


def check_mask_values(mask: Tensor, name: str = "attention_mask") -> None:
    """Refuse a mask holding anything but 0 and 1 (an additive mask would be read as its inverse), naming the
    value. ``m * (m - 1)`` is zero exactly where ``m`` is 0 or 1 (an integer product wraps, but ``m`` and
    ``m - 1`` share no factor of two)."""
    if mask.dtype == torch.bool:
        return
    if mask.is_complex() or bool(torch.any(mask * (mask - 1))):
        bad = mask[(mask != 0) & (mask != 1)]
        where = tuple(int(i) for i in ((mask != 0) & (mask != 1)).nonzero()[0])
        raise BertkitError(f"{name} holds {bad[0].item()!r} at {list(where)} ({mask.dtype}); a mask holds 1 at real "
                           "tokens and 0 at padding (bool, or int or float 0/1, as the tokenizer's attention_mask); "
                           "an additive mask (0 and a large negative number) is not one: pass (mask == 0).long()")


def require_compiler(device_type: str = "cpu") -> None:
    """Fail before any work when ``torch.compile`` cannot build CPU kernels (they are C++, compiled at run time)."""
    import shutil

    if device_type == "cpu" and not any(shutil.which(c) for c in ("g++", "c++", "clang++")):
        raise BertkitError("torch.compile on CPU needs a C++ compiler and none of g++, c++, clang++ is on PATH; "
                           "install one (e.g. apt install g++) or run without --compile / compile_layers()")


def inductor_cache_dir() -> str:
    """Where PyTorch keeps its Inductor cache: TORCHINDUCTOR_CACHE_DIR, else TMPDIR's torchinductor_USER (torch's
    ``cache_dir_utils``, computed here without importing ``torch._inductor``, which takes seconds)."""
    given = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if given is not None:
        return os.path.abspath(given)
    import getpass
    import tempfile

    try:
        user = getpass.getuser()
    except (KeyError, ModuleNotFoundError, OSError):
        user = f"uid_{os.getuid()}" if hasattr(os, "getuid") else "unknown_user"
    return os.path.join(tempfile.gettempdir(), "torchinductor_" + re.sub(r'[\\/:*?"<>|]', "_", user))


def compile_options() -> dict[str, int]:
    """Inductor options for every ``torch.compile`` bertkit makes: the SIMD width its CPU kernels are generated for,
    stated, so that it is part of the key of Inductor's on-disk cache.

    Inductor writes its CPU kernels for the vector ISA it picks here (AVX-512's 16 floats a vector, AVX2's 8, per
    ``ATEN_CPU_CAPABILITY``), but keys its FX-graph and AOTAutograd caches on the graph and its settings alone (no
    CPU: PyTorch 2.13). A ``TORCHINDUCTOR_CACHE_DIR`` shared by an AVX-512 and an AVX2 machine (a home directory, a
    network share, one image) then hands each the other's generated code, rebuilt for the wrong vector width:
    ``finetune --torch-compile`` on an AVX-512 CPU after one on an AVX2 CPU ended in "free(): invalid pointer", the
    other way in a segmentation fault, and int8's compiled quantization computed wrong ranges. ``cpp.simdlen`` is the
    width Inductor would pick anyway (it picks the ISA of that width), so the kernels are the same; 0 where it has
    none (no vector ISA: scalar code). AVX-512 with or without VNNI or AMX share a width and generate the same code
    outside max-autotune's GEMM templates; their compiler flags differ and key the built libraries."""
    try:  # the module of Inductor's ISA probe since PyTorch 2.5 (bertkit supports 2.6 on)
        from torch._inductor.cpu_vec_isa import pick_vec_isa
    except ImportError:  # a later PyTorch that moved it: compile as before, without the width in the key
        return {}
    return {"cpp.simdlen": pick_vec_isa().bit_width()}


def require_inductor_cache(compiling: bool = False) -> None:
    """Fail before any work when PyTorch cannot make its Inductor cache directory: building an optimizer imports
    ``torch._dynamo``, which creates it (a read-only TORCHINDUCTOR_CACHE_DIR failed training after the model and
    data were loaded, naming only the path); ``torch.compile`` (``compiling``) also writes its kernels there."""
    path = inductor_cache_dir()
    try:
        os.makedirs(path, exist_ok=True)
        if compiling and not os.access(path, os.W_OK | os.X_OK):
            raise PermissionError(errno.EROFS if read_only_mount(path) else errno.EACCES, "not writable", path)
    except OSError as e:
        why = os.strerror(errno.EROFS) if read_only_mount(path) else (e.strerror or str(e))
        source = ("TORCHINDUCTOR_CACHE_DIR" if "TORCHINDUCTOR_CACHE_DIR" in os.environ
                  else "PyTorch's default, in TMPDIR")
        raise BertkitError(f"PyTorch's Inductor cache directory {path} ({source}) cannot be "
                           f"{'written' if compiling else 'created'}: {why}. PyTorch makes it when an optimizer is "
                           f"built{' and writes compiled kernels there' if compiling else ''}; set "
                           "TORCHINDUCTOR_CACHE_DIR to a directory you can write to") from None


def check_fits_in_memory(config: BertConfig) -> None:
    """Refuse to build on the CPU a model whose parameters alone exceed this machine's memory (the kernel would
    kill the process only after building every layer before it); the meta device and accelerators are not checked."""
    if torch.get_default_device().type != "cpu":
        return
    memory = physical_memory_bytes()
    need = encoder_parameter_count(config) * torch.get_default_dtype().itemsize
    if memory is not None and need > memory:
        raise BertkitError(
            f"this BertConfig's {encoder_parameter_count(config):,} parameters need {need / 2**30:,.1f} GiB in "
            f"{torch.get_default_dtype()}, more than this machine's {memory / 2**30:,.1f} GiB of memory "
            f"(num_hidden_layers {config.num_hidden_layers}, hidden_size {config.hidden_size}, intermediate_size "
            f"{config.intermediate_size}, vocab_size {config.vocab_size}); is a size mistyped? (To build it for its "
            "shapes only, build it under `with torch.device('meta'):`)")


def physical_memory_bytes() -> int | None:
    """This machine's physical memory in bytes, or None where the OS does not say (no sysconf: Windows)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None
