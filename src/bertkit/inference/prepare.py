"""One way to make a model ready to run: its device, bf16 autocast or int8, its CPU inference transform, and a
record of which it got.

Every command, pipeline and the server applies a model through ``prepare_model``: the device is
``bertkit._hardware.resolve_device``'s answer, a float model asked to run in int8 is quantized here, a `bertkit
quantize` directory runs as it is, and bf16 left unset is off. On the CPU the model
that runs is a copy made for inference (``for_cpu_inference``), as ``torch.ao``'s conversions and OpenVINO's
passes make theirs; the model passed in stays plain ``nn.Linear`` modules, for training, peft and hooks.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from bertkit import _hardware, quantization
from bertkit._hardware import onednn_linear, resolve_device, warn_if_bf16_is_emulated
from bertkit.construction import copy_model
from bertkit.errors import BertkitError
from bertkit.inference.options import checked_flag
from bertkit.modeling import BertModel, global_module_hooks, has_hooks, plain_linear
from bertkit.quantization.kernels import without_backward


@dataclass(frozen=True)
class Precision:
    """How a prepared model runs: its device, the dtype its matmuls compute in, and whether (and on what text) its
    encoder's projections were quantized to int8."""

    device: torch.device
    dtype: str  # "bfloat16" under bf16 autocast, else the weights' ("float32"; a converted model's "float64", ...)
    quantize: str | None  # "int8" or None
    calibration: str | None = None  # with int8: "built-in", a calibration file, "texts", or what the int8 dir records
    # with int8: the kernel this CPU class runs (``_hardware.int8_kernel``), which the numbers depend on: an int8
    # directory runs at 8-bit activations on an AVX-512 VNNI CPU and at 7 on an AVX2 one (about 3x the rounding)
    kernel: _hardware.Int8Kernel | None = None

    @property
    def bf16(self) -> bool:
        """Whether the model runs under bf16 autocast (asked for; unset is off)."""
        return self.dtype == "bfloat16"

    def record(self) -> dict[str, Any]:
        """What a prediction report says about precision (as pipelines' ``.quantize`` and ``.bf16``): int8 or not,
        with its calibration and kernel (named as ``bertkit quantize``'s report names it), and the dtype what is not
        int8 ran in."""
        int8 = {} if self.quantize is None else {"calibration": self.calibration}
        if self.quantize is not None and self.kernel is not None:
            int8.update(kernel=self.kernel.name, activation_bits=self.kernel.activation_bits)
        return {"quantize": self.quantize, **int8, "float_dtype": self.dtype}


def check_request(device: str | torch.device = "cpu", *, bf16: bool | None = None, quantize: str | None = None,
                  calibrating: bool = False, local_rank: int = 0) -> torch.device:
    """The device a model asked to run so will run on, or an error naming why it cannot and the fix (an int8
    request on a GPU, with bf16 asked for on a CPU without bf16 instructions, without an int8 kernel for this CPU;
    an unknown ``quantize``; calibration without int8). Called before the weights load."""
    bf16 = checked_flag("bf16", bf16, "unset: off")
    if quantize is None:
        if calibrating:
            raise BertkitError("calibration_texts calibrate int8 inference: pass them with quantize='int8'")
        return torch.device(resolve_device(device, local_rank))
    if quantize != "int8":
        raise BertkitError(f"quantize {quantize!r} is not 'int8': quantize='int8' runs the encoder in int8 on the "
                           "CPU, quantize=None (the default) as loaded")
    return torch.device(resolve_device(device, local_rank, int8=True, bf16=bf16 is True))


def int8_model_request(quantize: Any, model: str) -> str:
    """What an int8 ``model`` (described for the message) runs as: "int8", the only precision it holds weights for.
    ``quantize`` unset or "int8" asks for that; anything else (False, what --no-int8 asks, or a value a float model
    refuses) is refused, not ignored."""
    if quantize is not None and quantize != "int8":
        raise BertkitError(f"quantize {quantize!r}: {model} and runs in int8 only: leave quantize unset (or 'int8'); "
                           "for float, pass the float checkpoint it was made from")
    return "int8"


def prepare_model(model: nn.Module, model_dir: str | Path | None = None, *,
                  device: str | torch.device = "cpu", bf16: bool | None = None, quantize: str | None = None,
                  calibration_texts: Sequence[str | tuple[str, str]] | None = None,
                  calibration_file: str | Path | None = None, tokenizer: Any = None, max_length: int | None = None,
                  local_rank: int = 0, in_place: bool = False) -> tuple[nn.Module, Precision]:
    """``model`` (loaded from ``model_dir``, which refusals name) on its device in eval mode, on the CPU as its copy
    made for inference (``for_cpu_inference``), with the record of its precision. ``quantize="int8"`` quantizes a
    float model (``quantize_int8_on_texts`` on ``calibration_texts``, ``calibration_file``'s lines, or the built-in
    sentences); an int8 model runs as it is and refuses a calibration. ``bf16`` None: off. ``in_place``: prepare
    ``model`` itself rather than a copy, for a model nothing else holds (one just loaded to run): a pipeline made from
    MiniLM's directory so takes 60 ms and 60 MB less at its peak."""
    bf16 = checked_flag("bf16", bf16, "unset: off")
    calibrating = calibration_texts is not None or calibration_file is not None
    int8_already = quantization.is_int8_model(model)
    if int8_already:
        if calibrating:
            raise BertkitError(f"{model_dir or 'the model'} is int8 already (calibrated when it was quantized); "
                               "calibration_texts apply when quantizing a float checkpoint: pass that with them")
        quantize = int8_model_request(quantize, f"{model_dir or 'the model'} is an int8 model (quantize_int8's or "
                                                "load_int8's)")
    dev = check_request(device, bf16=bf16, quantize=quantize, calibrating=calibrating, local_rank=local_rank)
    if not int8_already:
        model = model.to(dev)
    calibration = None
    if int8_already:
        calibration = (model.config.extra.get("quantization_config") or {}).get("calibration") or "built-in"
    elif quantize == "int8":
        texts = calibration_texts
        if calibration_file is not None:
            texts = quantization.read_calibration_file(Path(calibration_file))
        # looked up at the call (not imported by name): tests and tools can wrap it
        model = quantization.quantize_int8_on_texts(model, tokenizer, texts, max_length=max_length)
        calibration = (str(calibration_file) if calibration_file is not None
                       else "texts" if calibration_texts is not None else "built-in")
    if bf16 is None:
        # Unset is off, int8 too: with every projection int8, bf16 float parts (attention, GELU, LayerNorm) ran no
        # faster than fp32 ones on an AVX-512 BF16 EPYC (0.96-1.00x, BENCHMARKS.md "int8 on short texts")
        bf16 = False
    elif bf16:
        warn_if_bf16_is_emulated(dev.type)
        # autocast casts float32 weights only: with float16 ones PyTorch fails inside the first layer with a bare
        # error, and float64 ones ran in float64 under a record saying bfloat16
        odd = sorted(str(d).removeprefix("torch.") for d in {p.dtype for p in model.parameters()}
                     if d in (torch.float16, torch.float64))
        if not int8_already and odd:
            raise BertkitError(f"bf16 autocast runs float32 weights in bf16, and the model holds {odd[0]} weights: "
                               "call model.float() (or .bfloat16()) before passing the model with bf16, or leave "
                               f"bf16 off to run it in {odd[0]}")
    weights = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    if dev.type == "cpu":
        model = for_cpu_inference(model, bf16, in_place=in_place)
    # in eval mode after the copy: on the CPU the model passed in keeps its mode (one being trained stays in train)
    return model.eval(), Precision(dev, "bfloat16" if bf16 else str(weights).removeprefix("torch."), quantize,
                                   calibration, _hardware.check_int8_kernel() if quantize else None)


class ModelState:
    """What ``model`` was when a copy of it was prepared, to tell on each call whether the copy still computes what it
    does: its modules (which, of what type, with which hooks and plain settings such as a LayerNorm's eps) and its
    tensors (which, where, their in-place version counters, and a few values of each weight matrix). A pipeline made
    from a model the caller keeps runs its copy; without this check, weights edited in place, ``load_state_dict``, an
    optimizer's steps, layers cut or a head replaced after the pipeline was made left it answering with the old
    model, without a word (transformers' pipeline runs the model itself, so it answers with the new one).

    The values sampled (16 a matrix) catch what the version counters do not see: fused optimizers
    (``AdamW(fused=True)``, the Trainer's) and edits through ``.data`` update without counting. An edit through
    ``.data`` of a few values alone can slip past both: ``changed`` is a guard, not a proof. Comparing every weight
    took 32 ms on MiniLM, as long as three calls; this takes about a millisecond."""

    def __init__(self, model: nn.Module):
        self.model = model
        self.layout, self.samples = _state(model)

    def changed(self) -> bool:
        """Whether ``model`` is no longer what it was when this record was taken."""
        layout, samples = _state(self.model)
        # NaN equals NaN here: a model holding one is not prepared again on every call
        return layout != self.layout or not (torch.equal(samples, self.samples) or torch.allclose(
            samples, self.samples, rtol=0, atol=0, equal_nan=True))


_SETTINGS = (bool, int, float, str, type(None))


def _plain(value: Any) -> bool:
    """A setting compared by value: a number, a string, None, or a dict of them (a SparseEncoder's prompts)."""
    return isinstance(value, _SETTINGS) or isinstance(value, dict) and all(
        isinstance(v, _SETTINGS) for v in value.values())


def _state(model: nn.Module) -> tuple[list, Tensor]:
    """(what identifies ``model``'s modules and tensors, a few values of each of its weight matrices, as a copy)."""
    layout, samples, stack = [], [], [model]
    while stack:
        m = stack.pop()
        # the copy runs in eval mode whatever the model's: its mode is left out
        settings = tuple((k, v) for k, v in vars(m).items() if k != "training" and _plain(v))
        layout.append((id(m), type(m), tuple(m._forward_hooks), tuple(m._forward_pre_hooks), settings))
        for t in (*m._parameters.values(), *m._buffers.values()):
            if t is not None:
                layout.append((id(t), t.data_ptr(), t._version, t.dtype, t.shape))
                if t.dim() > 1 and t.is_floating_point():
                    flat = t.detach().reshape(-1)
                    samples.append(flat[:: max(1, flat.numel() // 16)])
        stack.extend(c for c in m._modules.values() if c is not None)
    return layout, torch.cat(samples).cpu() if samples else torch.zeros(0)


def optimize_for_inference(model: nn.Module, *, device: str | torch.device = "cpu", bf16: bool = False) -> nn.Module:
    """The copy of ``model`` that pipelines, ``predict`` and ``serve`` run (``prepare_model``): in eval mode on
    ``device``, and on the CPU its inference copy (``for_cpu_inference``: query, key and value one GEMM, weights
    prepared once for oneDNN, the GELU fused): the same outputs within fp32 rounding, about twice as fast on short
    texts. ``model`` keeps its plain ``nn.Linear`` modules and, on the CPU, its mode (for training, peft and
    hooks); the copy is for inference only. An int8 model (``quantize_int8``, ``load_int8``) stays int8. With
    ``bf16=True`` the copy is made for bf16: call it inside ``torch.autocast("cpu", dtype=torch.bfloat16)``, as
    pipelines do.

        model = bertkit.optimize_for_inference(BertModel.from_pretrained("models/minilm"))
    """
    if not isinstance(model, nn.Module):
        raise BertkitError(f"optimize_for_inference takes a loaded model (BertModel.from_pretrained(...)), got "
                           f"{type(model).__name__}")
    return prepare_model(model, device=device, bf16=bf16)[0]


# ---------------------------------------------------------------------------------------------------
# CPU inference: a copy of the model with its encoder's projections prepared once
# ---------------------------------------------------------------------------------------------------

# PyTorch's CPU flash attention walks the keys in vectors of 16 (AVX-512) or 8 (AVX2), and the keys past the last
# full vector cost several times as much (25 keys: 1.39 ms, 32 with 7 masked: 0.82 ms; BENCHMARKS.md, "Keys rounded
# up"). Only the keys' length matters, so keys and values are padded with masked keys, the queries are not
# (``cpu_key_multiple``).

# Under bf16 with AVX512-BF16 or AMX, oneDNN builds a GEMM kernel for every new row count (3-5 ms for one of MiniLM's
# Linear shapes on a Sapphire Rapids core, against 1-2 ms to run it) and keeps only the 1,024 most recent, so a
# long-running process that meets every token count N up to B*T keeps rebuilding them. Rounding N up to a multiple
# of 64 bounds the counts to ceil(N_max / 64) for at most 63 rows more (4% on batches of 32 SST-2 sentences). Not in
# fp32: oneDNN builds kernels for each row count there too, and what it keeps of them is memory (2.3 MiB a
# new count on the AVX-512 EPYC, level 460 MiB up once the caches are full: BENCHMARKS.md, "Soak"), where the rows
# would be compute on every call; the server bounds those caches instead (serve_batching.bound_onednn_caches).
BF16_TOKEN_MULTIPLE = 64

NOT_FOR_TRAINING = ("the inference copy (optimize_for_inference, prepare_model) is for inference only: its projections "
                    "are prepared weights without a backward; train, or take gradients through, the model it was "
                    "made from")

# oneDNN's fused post-operations for the feed-forward activations (``_linear_pointwise``'s attr and algorithm); fused
# in fp32 only, where "gelu_new"'s op-by-op formula (NewGELU) and the fused tanh GELU agree within fp32 rounding.
_ONEDNN_ACTIVATIONS = {("GELU", "none"): ("gelu", "none"), ("GELU", "tanh"): ("gelu", "tanh"),
                       ("NewGELU", None): ("gelu", "tanh"), ("ReLU", None): ("relu", "")}


def cpu_key_multiple() -> int:
    """What attention's keys are rounded up to on this CPU: its attention kernel's vector width (16 on AVX-512, 8 on
    AVX2); 1 (no rounding) on CPUs whose width was not measured."""
    capability = torch.backends.cpu.get_cpu_capability()
    return 16 if capability.startswith("AVX512") else 8 if capability == "AVX2" else 1


class PreparedLinear(nn.Module):
    """``x W^T + b`` for CPU inference, in ``dtype``, over a weight prepared once: reordered for oneDNN's Linear
    (``torch.ops.mkldnn._linear_pointwise``, the kernel Inductor's CPU backend calls) where the probe
    ``_hardware.onednn_linear`` says it runs, else a copy in ``dtype`` for ``F.linear``. oneDNN ran 6-19% faster than
    ATen's ``addmm`` in fp32 (1.1-1.6x with the GELU fused, ``activation``) and 3-11% in bf16; the bf16 copy saves
    autocast's cast of every weight on every call (BENCHMARKS.md, "Linear layers on oneDNN"). The input is cast to
    ``dtype`` as autocast casts it, so in bf16 the output is autocast's (within bf16 rounding on oneDNN's weight).

    Inference only (``train`` and a backward pass are refused): the weights are a snapshot, outside the state dict.
    ``source`` keeps the float32 weight and bias it was made from, from which ``copy.deepcopy``, ``pickle`` (a
    spawned DataLoader worker's or ``datasets.map(num_proc=...)``'s copy) and ``for_cpu_inference`` make it again,
    for the CPU it then runs on (the reordered weight is an opaque tensor nothing can copy or pickle)."""

    def __init__(self, weight: Tensor, bias: Tensor | None, dtype: torch.dtype, activation: nn.Module | None = None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.source = (weight.detach(), None if bias is None else bias.detach())
        self.activation = activation  # fused into the product (then the block's own is nn.Identity), or None
        # oneDNN's bf16 Linear only where the CPU has bf16 instructions; elsewhere bf16 runs emulated
        self.onednn = onednn_linear() and (dtype == torch.float32 or _hardware.cpu_has_bf16())
        weight = weight.detach().to(dtype)
        # the reordering's batch-size hint only picks the layout: any number of rows runs (1,024: ~32 sentences)
        self.weight = torch.ops.mkldnn._reorder_linear_weight(weight, 1024) if self.onednn else weight
        self.bias = None if bias is None else bias.detach().to(dtype)
        self.dtype = dtype
        self.training = False  # for inference only (``train`` refuses)
        self.post_op = ("none", "")
        if activation is not None:
            if not self.onednn or dtype != torch.float32:
                raise ValueError("PreparedLinear fuses an activation only on oneDNN's fp32 Linear")
            self.post_op = _ONEDNN_ACTIVATIONS[(type(activation).__name__, getattr(activation, "approximate", None))]

    def __deepcopy__(self, memo: dict) -> PreparedLinear:
        return PreparedLinear(*copy.deepcopy(self.source, memo), self.dtype, copy.deepcopy(self.activation, memo))

    def __reduce_ex__(self, protocol: int) -> tuple:
        # pickle (torch.save of the model, a pipeline sent to a worker process) as deepcopy copies: the float32 weights
        # it was made from, prepared again where they are loaded. The reordered weight is an opaque tensor pickle cannot
        # write (NotImplementedError: "Cannot access storage of OpaqueTensorImpl"), and its layout is this CPU's.
        return PreparedLinear, (*self.source, self.dtype, self.activation)

    def _apply(self, fn: Any, recurse: bool = True) -> PreparedLinear:
        # .to(), .double(), .half() reach here, and the prepared weight is no parameter they could convert: the
        # projections would stay fp32 in a float64 model, or fail inside a float16 one
        self.refuse_conversion(fn)
        return self

    def refuse_conversion(self, fn: Any) -> None:
        """Raise where ``fn`` (what ``.to()``, ``.half()``, ... apply) would change the weight's dtype or device; a
        bertkit model asks before converting any of its parameters (``PretrainedMixin._apply``), so a refused
        ``.half()`` leaves the copy whole (its embeddings were float16 after the error, its outputs 7e-4 off)."""
        weight = self.source[0]
        converted = fn(weight)
        if (converted.dtype, converted.device) != (weight.dtype, weight.device):
            raise BertkitError(f"the inference copy's projections are prepared from {weight.dtype} weights on "
                               f"{weight.device}, not {converted.dtype} on {converted.device}: convert the model it "
                               "was made from (model.to(...)) and prepare that (optimize_for_inference)")

    def forward(self, x: Tensor) -> Tensor:
        if torch.compiler.is_compiling() or torch.jit.is_tracing():
            # Inductor cannot lower oneDNN's reordered weight (an opaque tensor: a LoweringException ended
            # compile_layers() or torch.compile of the copy), nor can torch.jit.trace hold it ("Unsupported value
            # kind: Tensor"); both take F.linear, Inductor lowering it to its own CPU kernels
            weight, bias = (None if t is None else t.to(self.dtype) for t in self.source)
            y = F.linear(x.to(self.dtype), weight, bias)
            y = y if self.activation is None else self.activation(y)
        elif self.onednn:
            y = torch.ops.mkldnn._linear_pointwise(x.to(self.dtype), self.weight, self.bias, self.post_op[0], [],
                                                   self.post_op[1])
        else:
            y = F.linear(x.to(self.dtype), self.weight, self.bias)
        # oneDNN's Linear has no backward (a backward through the copy ran with wrong gradients), and neither kernel
        # trains the weights, a snapshot: a backward pass is refused
        return without_backward(y, x, NOT_FOR_TRAINING)

    def refuse_training(self) -> None:
        """Raise: the copy is for inference only (a bertkit model asks before switching any module to training)."""
        raise BertkitError(NOT_FOR_TRAINING)

    def train(self, mode: bool = True) -> PreparedLinear:
        if mode:
            self.refuse_training()
        return super().train(False)

    def extra_repr(self) -> str:
        kernel = "oneDNN" if self.onednn else "F.linear"
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.dtype}, {kernel}, post_op={self.post_op[0]}"


def _weights(module: nn.Module | None) -> tuple[Tensor, Tensor | None] | None:
    """The float32 weight and bias a projection computes with: a plain ``nn.Linear``'s (``modeling.plain_linear``: no
    subclass, hook or ``forward`` of its own, so its call is ``F.linear``), or what a ``PreparedLinear`` was made
    from; None for anything else (int8, peft's wrappers, pruned, parametrized or hooked modules: left as they are)."""
    if isinstance(module, PreparedLinear):
        return module.source
    return (module.weight, module.bias) if plain_linear(module) else None


def for_cpu_inference(model: nn.Module, bf16: bool, *, in_place: bool = False) -> nn.Module:
    """A copy of ``model`` that computes what it does, for inference on this CPU (under bf16 autocast with
    ``bf16``). In every fp32 bertkit encoder in it, each layer's plain ``nn.Linear`` projections become
    ``PreparedLinear`` modules, query, key and value one module (``qkv``, one GEMM), and in fp32 the feed-forward's
    activation is fused into its first product where oneDNN runs it (``_prepare_dense``). Attention's keys are
    rounded up to ``cpu_key_multiple`` and, in bf16, the layers' rows to ``BF16_TOKEN_MULTIPLE``. Projections that
    are not plain ``nn.Linear`` (peft's wrappers, hooked modules) stay as they are; ``model`` is unchanged (with
    ``in_place``, for a model nothing else holds, it is the one prepared, without a copy of its weights). A model
    prepared for the other precision is prepared again from the weights it was made from (a pipeline's model given
    to another pipeline); one prepared for this precision already, or without a float32 bertkit encoder, is
    returned as it is, and so is any model while a hook is registered for every module
    (``register_module_forward_hook``): such a hook knows the model's own modules (``m is target``, a dict of module
    names), not a copy's, and ran on none of them (SentenceTransformer vectors 0.28 off sentence-transformers' with
    one halving a layer's output). The copy is for inference only: its ``.train()`` and a backward pass through it
    are refused."""
    dtype = torch.bfloat16 if bf16 else torch.float32
    prepared = {m.dtype for m in model.modules() if isinstance(m, PreparedLinear)}
    if prepared == {dtype} or global_module_hooks() or not any(isinstance(m, BertModel) and m.embeddings.word_embeddings.weight.dtype
                                      == torch.float32 for m in model.modules()):
        return model
    if not in_place:
        model = copy_model(model)
    for encoder in (m for m in model.modules() if isinstance(m, BertModel)):
        if encoder.embeddings.word_embeddings.weight.dtype != torch.float32:
            continue
        encoder.key_multiple = cpu_key_multiple()
        encoder.token_multiple = BF16_TOKEN_MULTIPLE if bf16 else 1
        for layer in encoder.encoder.layer:
            attn = layer.attention.self
            three = [_weights(m) for m in (attn.query, attn.key, attn.value)]
            if attn.qkv is None and all(w is not None and w[1] is not None for w in three):
                attn.qkv = PreparedLinear(torch.cat([w for w, _ in three]), torch.cat([b for _, b in three]),
                                          dtype)  # (3H, H), (3H,)
                attn.query = attn.key = attn.value = None
            elif isinstance(attn.qkv, PreparedLinear):
                attn.qkv = PreparedLinear(*attn.qkv.source, dtype)
            for block in (layer.attention.output, layer.intermediate, layer.output):
                _prepare_dense(block, dtype)
    return model


def encoder_for_encode(bert: nn.Module) -> nn.Module:
    """The encoder a sentence model's ``encode`` of more than one batch runs on the CPU: its inference copy
    (``for_cpu_inference``), or ``bert`` itself where one of its modules has a hook of its own. The copy carries the
    hooks, but calls them with its own modules: a hook that knows the model's (``module is layer``, a dict keyed by
    module, as activation-capturing code keeps) matched none of them, so it captured nothing where
    sentence-transformers' encode captured every batch (or raised a KeyError in the caller's hook). Without a copy
    the encode is the plain model's, 1.24x slower on SQuAD paragraphs."""
    return bert if has_own_hooks(bert) else for_cpu_inference(bert, bf16=False)


def has_own_hooks(model: nn.Module) -> bool:
    """Whether a module of ``model`` has a hook of its own, which its inference copy would call with the copy's module
    (``encoder_for_encode`` and a pipeline run such a model itself)."""
    return any(has_hooks(m) for m in model.modules())


def _prepare_dense(block: nn.Module, dtype: torch.dtype) -> None:
    """``block.dense`` made a ``PreparedLinear`` (a plain float one) or left int8, with the block's activation
    (``intermediate_act_fn``) fused into it in fp32 where oneDNN computes the product: its float Linear
    (``_hardware.onednn_linear``) or its int8 kernel (``Int8Linear.fused_with``; fbgemm, the AVX2 class, has no
    post-operation). Measured 1.1-1.6x a float feed-forward product and 1.07-1.12x the whole int8 model on a Sapphire
    Rapids core (BENCHMARKS.md). Not in bf16: a fused GELU rounds once, not twice as autocast does, which moved the
    int8 model's pooled outputs by cosine 0.9987. A block fused before (prepared for fp32, now for bf16) is split
    again."""
    dense = block.dense
    act = getattr(dense, "activation", None) or getattr(block, "intermediate_act_fn", None)  # fused before, or not
    post_op = None if act is None or dtype != torch.float32 else _ONEDNN_ACTIVATIONS.get(
        (type(act).__name__, getattr(act, "approximate", None)))
    if isinstance(dense, quantization.Int8Linear):
        if act is None or dense.kernel.name != "onednn":
            return
        fused = post_op is not None
        if fused or dense.activation is not None:  # to fuse, or to split a layer fused before
            block.dense = dense.fused_with(act if fused else None, post_op or ("none", ""))
    else:
        weights = _weights(dense)
        if weights is None:
            return
        fused = post_op is not None and onednn_linear()
        block.dense = PreparedLinear(*weights, dtype, act if fused else None)
    if act is not None:
        block.intermediate_act_fn = nn.Identity() if fused else act
