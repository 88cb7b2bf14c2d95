"""BertConfig: the typed, self-validating description of a BERT network.

Field names are the published ``config.json`` keys, so a config round-trips as a plain dict, keys bertkit does
not use (``transformers_version``, ...) included: they live in ``extra``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError, MissingFileError, no_hub, read_json_object
from bertkit.outputs import atomic_write_text

# The hidden_act values bertkit computes as transformers does (modeling.activation builds each). "gelu" is the exact
# erf GELU (google-research/bert's modeling.py first computed erf's, later the tanh approximation, "gelu_new" here).
ACTIVATIONS = ("gelu", "gelu_new", "gelu_fast", "gelu_pytorch_tanh", "quick_gelu", "relu", "silu", "swish", "mish",
               "tanh")
PROBLEM_TYPES = ("regression", "single_label_classification", "multi_label_classification")
DEFAULT_ID2LABEL = {0: "LABEL_0", 1: "LABEL_1"}
# Written to config.json only when they differ from these defaults (runtime switches, not the network's shape).
_RUNTIME_DEFAULTS = {"output_hidden_states": False, "output_attentions": False, "return_dict": True}
# The fields __post_init__ checks, by what they must hold (a config.json written by hand may hold "0.1" or null).
_SIZES = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
          "max_position_embeddings", "type_vocab_size")  # positive ints
_PROBABILITIES = ("hidden_dropout_prob", "attention_probs_dropout_prob", "classifier_dropout")  # in [0, 1)
_POSITIVE_FLOATS = ("initializer_range", "layer_norm_eps")
_SWITCHES = ("output_hidden_states", "output_attentions", "return_dict")
# transformers' loading keywords with no bertkit field, and what does their job here (said when one is refused).
# transformers' config keywords that are no BertConfig field but are kept in config.json as given (``extra``), as
# transformers writes them: run_glue's and run_ner's ``finetuning_task`` (a GLUE pair task there tells a pipeline
# that the model reads text pairs, docs/inference.md).
_KEPT_AS_WRITTEN: dict[str, type] = {"finetuning_task": str}

_TRANSFORMERS_ONLY = {
    "torchscript": "torchscript=True is not needed: torch.jit.trace(model, (input_ids, attention_mask, "
                   "token_type_ids)) traces a bertkit model as it is and the trace returns the output's tuple",
}


_DECODER_SWITCHES = ("is_decoder", "add_cross_attention")
# config.json's dtype of the saved weights (a string), which save_pretrained writes from the model's: not read or set
# as an attribute, where transformers' config.dtype follows the loaded model's (model.dtype here)
_WEIGHTS_DTYPE_KEYS = ("dtype", "torch_dtype")


def _decoder_refusal(switches: list[str]) -> BertkitError:
    return BertkitError(f"BertConfig {' and '.join(f'{k}=true' for k in switches)}: BERT as a decoder (causal "
                        "attention, cross-attention) is not implemented, and its outputs would differ from the "
                        "checkpoint's (transformers' attention turns causal); bertkit's BERT is the paper's "
                        "bidirectional encoder. If the checkpoint was trained as an encoder, set them to false in "
                        "config.json (or leave them unset)")


def encoder_parameter_count(config: BertConfig) -> int:
    """Closed-form parameter count of BertModel with its pooler (the paper's 110M for BASE, 340M for LARGE)."""
    H, I, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    embeddings = (config.vocab_size + config.max_position_embeddings + config.type_vocab_size) * H + 2 * H
    layer = 4 * H * H + 4 * H + 2 * H + 2 * H * I + I + H + 2 * H  # q, k, v, out; LN; FFN in and out; LN
    return embeddings + L * layer + H * H + H


@dataclass
class BertConfig:
    """Hyper-parameters of a BERT encoder (and, through ``id2label``/``problem_type``, of its task head).

    Defaults are BERT-BASE (Devlin et al. 2018, section 3: L=12, H=768, A=12, 110M parameters).
    """

    vocab_size: int = 30522
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_act: str = "gelu"  # one of ACTIVATIONS
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    # Std of the normal initialiser (transformers' draw, modeling.init_bert_weights); 0.02 as in google-research/bert.
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int | None = 0  # None (transformers' null): no padding row, every word embedding trained
    position_embedding_type: str = "absolute"
    # Task-head fields, named as transformers names them so fine-tuned checkpoints round-trip.
    classifier_dropout: float | None = None
    id2label: dict[int, str] | None = None
    problem_type: str | None = None
    # Output switches a forward call falls back to when it does not pass them (transformers reads them from
    # the config too: `model.config.output_hidden_states = True` is honoured by every later call).
    output_hidden_states: bool = False
    output_attentions: bool = False
    return_dict: bool = True
    # The classes config.json names (a model's save_pretrained writes its own), which generic scripts read to pick
    # a head; and where the config was loaded from (transformers' ``_name_or_path``: set on loading, never written).
    architectures: list[str] | None = None
    name_or_path: str = field(default="", compare=False)
    # Unknown config.json keys, kept verbatim so saving writes them back.
    extra: dict[str, Any] = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        for name in (*_PROBABILITIES, *_POSITIVE_FLOATS):
            value = getattr(self, name)
            if value is None and name == "classifier_dropout":
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise BertkitError(f"BertConfig.{name} must be a finite number, got {value!r}"
                                   + (" (a string: write it without quotes)" if isinstance(value, str) else ""))
            if name in _PROBABILITIES and not 0.0 <= value < 1.0:
                raise BertkitError(f"BertConfig.{name} must be in [0, 1), got {value!r}")
            if name in _POSITIVE_FLOATS and value <= 0:
                raise BertkitError(f"BertConfig.{name} must be positive, got {value!r}")
        for name in (*_SIZES, "pad_token_id"):
            value = getattr(self, name)
            if value is None and name == "pad_token_id":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < (name != "pad_token_id"):
                raise BertkitError(f"BertConfig.{name} must be a {'positive' if name in _SIZES else 'non-negative'} "
                                   f"int{'' if name in _SIZES else ' (or null)'}, got {value!r}")
        for name in _SWITCHES:
            if not isinstance(getattr(self, name), bool):
                raise BertkitError(f"BertConfig.{name} must be true or false, got {getattr(self, name)!r}")
        if self.hidden_size % self.num_attention_heads:
            raise BertkitError(
                f"BertConfig.hidden_size {self.hidden_size} is not divisible by num_attention_heads "
                f"{self.num_attention_heads}; choose a head count that divides it (e.g. hidden_size // 64)"
            )
        if self.hidden_act not in ACTIVATIONS:
            raise BertkitError(f"BertConfig.hidden_act {self.hidden_act!r} is not one of {ACTIVATIONS}, the activations "
                               "bertkit computes as transformers does; load a checkpoint with another one with "
                               "transformers")
        if self.position_embedding_type != "absolute":
            raise BertkitError(
                f"BertConfig.position_embedding_type {self.position_embedding_type!r} is not supported; "
                "bertkit implements the paper's learned absolute positions ('absolute')"
            )
        decoder = [k for k in _DECODER_SWITCHES if self.extra.get(k)]  # transformers' switches
        if decoder:
            raise _decoder_refusal(decoder)
        if isinstance(self.architectures, str):  # one class written as a string, which config.json readers take
            self.architectures = [self.architectures]
        if self.architectures is not None and (not isinstance(self.architectures, list)
                                               or not all(isinstance(a, str) for a in self.architectures)):
            raise BertkitError(f"BertConfig.architectures must be a list of class names like [\"BertForMaskedLM\"], "
                               f"got {self.architectures!r}")
        if not isinstance(self.name_or_path, str):
            self.name_or_path = str(self.name_or_path)  # a Path, as transformers' str(name_or_path)
        if self.pad_token_id is not None and self.pad_token_id >= self.vocab_size:
            raise BertkitError(f"BertConfig.pad_token_id {self.pad_token_id} is outside the vocabulary (size {self.vocab_size})")
        self._normalise_labels()

    def __setattr__(self, name: str, value: Any) -> None:
        # ``config.id2label = json.load(f)`` after construction (JSON's keys are strings) is read as the constructor
        # reads it: ``id2label[0]`` (pipelines, label names in metrics) and ``label2id``'s ids would otherwise be
        # KeyErrors and the strings "0", "1"; a map that is not 0..n-1 is refused, the config left as it was.
        if name == "id2label" and "id2label" in self.__dict__:
            value = _label_map(value)
        # ``model.config.is_decoder = True``: transformers' attention reads it at each call and turns causal; here it
        # would be an attribute nothing reads, the outputs still bidirectional
        if name in _DECODER_SWITCHES and value:
            raise _decoder_refusal([name])
        if name not in _FIELDS and name not in _WEIGHTS_DTYPE_KEYS and not name.startswith("_") and \
                not hasattr(type(self), name) and "extra" in self.__dict__:
            # A key that is no field (``model.config.use_cache = False``, a script's own key): kept with config.json's
            # other keys and written with them, as transformers keeps and writes it; as a plain attribute it was
            # never saved, and one config.json held already was saved with its old value
            object.__setattr__(self, "extra", {**self.extra, name: value})  # a new dict: copies may share the old
            return
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        """config.json's keys that are no field read as attributes (``config.use_cache``, a script's own key), as
        transformers' config has them; only called where no field, property or method has the name."""
        extra = self.__dict__.get("extra")
        if name in _WEIGHTS_DTYPE_KEYS:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}: read the model's dtype, "
                                 "model.dtype (config.json's dtype is the one the weights were saved in)")
        if extra is not None and not name.startswith("__") and name in extra:
            return extra[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def _normalise_labels(self) -> None:
        """id2label with int keys 0..n-1 (transformers' two default labels when none are named), and a known
        problem_type."""
        self.id2label = _label_map(self.id2label)
        if self.problem_type is not None and self.problem_type not in PROBLEM_TYPES:
            raise BertkitError(f"BertConfig.problem_type {self.problem_type!r} is not one of {PROBLEM_TYPES}")
        if self.problem_type == "single_label_classification" and len(self.id2label) == 1:
            # a softmax over one label is 1.0 whatever the input, and its cross-entropy 0 (transformers refuses it too)
            raise BertkitError("BertConfig.problem_type 'single_label_classification' needs num_labels > 1, got 1 label "
                               f"{list(self.id2label.values())}: a softmax over one label scores every input 1.0; set "
                               "problem_type 'regression' (or 'multi_label_classification', a sigmoid) for one output, "
                               "or num_labels 2 for a binary classifier")

    model_type = "bert"  # a class attribute, as transformers' BertConfig.model_type (not a field: never varies)

    @property
    def num_labels(self) -> int:
        """Number of outputs of a classification head: ``id2label``'s labels (transformers' two default ones when none
        are named; none for an empty ``id2label``, as a backbone's config.json has it, which no classifier takes)."""
        return len(self.id2label)

    @num_labels.setter
    def num_labels(self, n: int) -> None:
        """As transformers: setting another count renames the labels LABEL_0..LABEL_{n-1}; the same count keeps them."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise BertkitError(f"num_labels must be a positive int (the classifier's outputs), got {n!r}")
        if n != self.num_labels:
            self.id2label = {i: f"LABEL_{i}" for i in range(n)}

    @property
    def _name_or_path(self) -> str:
        """transformers' stored name of ``name_or_path``, which scripts and model cards read."""
        return self.name_or_path

    @property
    def use_return_dict(self) -> bool:
        """transformers' name for ``return_dict`` as a forward reads it: ``return_dict if return_dict is not None else
        self.config.use_return_dict``, the first line of every transformers head, and so of heads copied from one."""
        return self.return_dict

    @property
    def label2id(self) -> dict[str, int]:
        return {v: k for k, v in (self.id2label or {}).items()}

    @label2id.setter
    def label2id(self, label2id: dict[str, int]) -> None:
        """Names the labels as transformers' scripts do (``run_glue``: ``model.config.label2id = label_to_id``, then
        ``id2label`` from it): ``id2label`` becomes its inverse, so the two maps never disagree."""
        if not isinstance(label2id, dict) or sorted(label2id.values()) != list(range(len(label2id))):
            raise BertkitError(f"BertConfig.label2id must map each label to its own id 0..n-1, like {{\"NEGATIVE\": 0, "
                               f"\"POSITIVE\": 1}}, got {label2id!r}")
        self.id2label = {i: label for label, i in label2id.items()}  # names checked as id2label's

    def with_labels(self, labels: list[str] | int) -> BertConfig:
        """A copy whose classification head has these label names (or this many ``LABEL_i`` labels)."""
        if isinstance(labels, int):
            if labels < 1:
                raise BertkitError(f"num_labels must be >= 1, got {labels}")
            labels = [f"LABEL_{i}" for i in range(labels)]
        return dataclasses.replace(self, id2label=dict(enumerate(labels)), extra=dict(self.extra))

    def check_sequence_length(self, length: int, name: str = "max_length", model: str = "this model") -> None:
        """Refuse a sequence length above ``max_position_embeddings``, naming both numbers and the fix: the one check
        of every command's --max-seq-length / --max-length, pipeline and feature extraction, made before the text
        is read (the forward pass would refuse the first sequence that long, after the work before it)."""
        if length > self.max_position_embeddings:
            raise BertkitError(f"{name} {length} exceeds max_position_embeddings {self.max_position_embeddings} of "
                               f"{model}: it has no position embedding beyond {self.max_position_embeddings} tokens; "
                               f"pass {name} {self.max_position_embeddings} or less")

    # ---- dict / JSON ---------------------------------------------------------------------------------
    @classmethod
    def check_overrides(cls, overrides: dict[str, Any]) -> None:
        """Refuse a keyword that is no field. Unknown config.json keys are kept (``extra``); an unknown keyword is a
        mistake (a typo, device_map), refused by ``from_pretrained`` before a file is read or downloaded."""
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        unknown = sorted(set(overrides) - known - {"num_labels", "label2id"} - set(_KEPT_AS_WRITTEN))
        if unknown:
            hints = "".join(f"; {_TRANSFORMERS_ONLY[k]}" for k in unknown if k in _TRANSFORMERS_ONLY)
            raise BertkitError(f"unknown keyword argument{'s' if len(unknown) > 1 else ''} {', '.join(unknown)}: "
                               f"not a BertConfig field (fields: {', '.join(sorted(known))}, or num_labels){hints}")
        for key, kind in _KEPT_AS_WRITTEN.items():
            if overrides.get(key) is not None and not isinstance(overrides[key], kind):
                raise BertkitError(f"{key} must be a {kind.__name__} (or None), got {overrides[key]!r}")
        if overrides.get("id2label") is not None or overrides.get("label2id") is not None:
            # labels given as keywords must agree with each other (checked as such, not as config.json's)
            cls(id2label=overrides.get("id2label"), num_labels=overrides.get("num_labels"),
                label2id=overrides.get("label2id"))

    @classmethod
    def from_dict(cls, data: dict[str, Any], **overrides: Any) -> BertConfig:
        model_type = data.get("model_type", "bert")
        if model_type != "bert":
            raise BertkitError(f"a {model_type!r} checkpoint (model_type {model_type!r}); bertkit implements BERT "
                               "(model_type 'bert') only: load it with transformers")
        cls.check_overrides(overrides)
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        merged = {**data, **overrides}
        kwargs = {k: v for k, v in merged.items() if k in known}
        # Derived: label2id (from id2label), model_type; and where a config was loaded from, which transformers
        # writes into no file but older versions did (a stale Hub id, kept verbatim, would be written back).
        derived = ("label2id", "num_labels", "model_type", "_name_or_path")
        extra = {k: v for k, v in merged.items() if k not in known and k not in derived}
        if "id2label" in overrides:  # the labels named now: a label count or label2id given too must agree with them
            kwargs["num_labels"], kwargs["label2id"] = overrides.get("num_labels"), overrides.get("label2id")
        elif overrides.get("label2id") is not None:
            kwargs.pop("id2label", None)
            kwargs["num_labels"], kwargs["label2id"] = overrides.get("num_labels"), overrides["label2id"]
        else:  # a label count (config.json's or the caller's) renames config.json's labels when it differs from theirs
            kwargs["num_labels"] = merged.get("num_labels")
            if kwargs["num_labels"] is not None and len(kwargs.get("id2label") or DEFAULT_ID2LABEL) != kwargs["num_labels"]:
                kwargs.pop("id2label", None)
        return cls(**kwargs, extra=extra)  # the constructor takes transformers' num_labels and label2id

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if f.name in ("id2label", "name_or_path") or (
                    f.name in ("classifier_dropout", "problem_type", "architectures") and value is None):
                continue
            if f.name in _RUNTIME_DEFAULTS and value == _RUNTIME_DEFAULTS[f.name]:
                continue
            out[f.name] = value
        if self.id2label is not None and self.id2label != DEFAULT_ID2LABEL:
            out["id2label"] = {str(k): v for k, v in self.id2label.items()}
            out["label2id"] = self.label2id
        out.setdefault("model_type", "bert")
        return out

    @classmethod
    def from_pretrained(cls, path: str | Path, **overrides: Any) -> BertConfig:
        """The config of a checkpoint directory (its config.json), a config.json file, or a Hub id
        (``bertkit.hub``); keyword arguments override fields, as in ``from_json_file``."""
        from bertkit.hub import refuse_hub_options, resolve_directory

        local_files_only = refuse_hub_options(path, overrides)
        cls.check_overrides(overrides)
        directory = resolve_directory(path, local_files_only=local_files_only)
        config = cls.from_json_file(directory / "config.json" if directory.is_dir() else directory, **overrides)
        config.name_or_path = str(path)  # as given (a Hub id stays one), as transformers records it
        return config

    @classmethod
    def from_json_file(cls, path: str | Path, **overrides: Any) -> BertConfig:
        path = Path(path)
        if not path.is_file():
            from bertkit.hub import cache_hint

            raise MissingFileError(
                f"config file {path} does not exist{cache_hint(path.parent)}; a checkpoint directory needs config.json "
                "(save one with BertConfig.save_pretrained or pick a preset with BertConfig.preset)"
            )
        data = read_json_object(path, "write the config as one JSON object, or re-save the checkpoint")
        try:
            return cls.from_dict(data, **overrides)
        except BertkitError as e:
            given = ", ".join(f"{k}={v!r}" for k, v in overrides.items())
            raise BertkitError(f"{path}" + (f" with {given}" if given else "") + f": {e}") from None

    def update(self, config_dict: dict[str, Any]) -> None:
        """transformers' ``config.update({"hidden_dropout_prob": 0.0})``: set fields (or ``num_labels``,
        ``label2id``), checked as the constructor checks them; a refused value or an unknown key (a typo that
        transformers would keep as a new attribute) leaves the config as it was."""
        if not isinstance(config_dict, dict):
            raise BertkitError(f"BertConfig.update takes a dict of fields, got a {type(config_dict).__name__}")
        updated = self.from_dict({**self.to_dict(), "name_or_path": self.name_or_path}, **config_dict)
        self.__dict__.update(updated.__dict__)

    def get_text_config(self, decoder: bool | None = None, encoder: bool | None = None) -> BertConfig:
        """transformers' config of the text model, which peft reads (prompt tuning: its vocabulary size): BERT's
        is this one."""
        return self

    def to_json_string(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n"

    def push_to_hub(self, *args: Any, **kwargs: Any) -> None:
        """Refused naming the fix (``no_hub``): transformers' method uploads, and bertkit reaches no hub."""
        raise no_hub(self)

    def save_pretrained(self, directory: str | Path) -> Path:
        """Write ``config.json`` into ``directory`` (created if needed), as transformers' ``save_pretrained``."""
        directory = Path(directory)
        if directory.exists() and not directory.is_dir():
            raise BertkitError(f"{directory} is a file; save_pretrained writes config.json into a directory")
        directory.mkdir(parents=True, exist_ok=True)
        atomic_write_text(directory / "config.json", self.to_json_string())
        return directory

    # ---- presets -------------------------------------------------------------------------------------
    @classmethod
    def preset(cls, name: str, **overrides: Any) -> BertConfig:
        """Published shapes: the paper's BASE and LARGE, and Google's BERT miniatures (Turc et al. 2019)."""
        if name not in PRESETS:
            raise BertkitError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls.from_dict(PRESETS[name], **overrides)


def refuse_other_network(directory: str | Path) -> None:
    """Refuse a checkpoint directory whose config.json describes a network bertkit does not implement (another
    model_type, ALiBi or relative positions, a decoder, another activation) before its tokenizer or weights are read:
    those checks come later and, on a DistilBERT, RoBERTa or XLM-R directory, failed first with another diagnosis (no
    vocab.txt, no masked-LM or classifier head, a vocabulary size) whose fix does not apply. A directory without
    config.json, or with a sentence-transformers module's own config.json (no model_type), passes."""
    config_file = Path(directory) / "config.json"
    if config_file.is_file():
        BertConfig.from_json_file(config_file)


def _label_map(labels: Any) -> dict[int, str]:
    """``id2label`` with int keys 0..n-1 (config.json's keys are strings), or transformers' two default labels for
    None; anything else is refused, naming it."""
    if labels is None:
        return dict(DEFAULT_ID2LABEL)
    if not isinstance(labels, dict):
        raise BertkitError(f"BertConfig.id2label must be a mapping like {{\"0\": \"NEGATIVE\", \"1\": "
                           f"\"POSITIVE\"}}, got a {type(labels).__name__}: {labels!r}")
    # str() of anything made a name of None, a list or a bool ("None"), which pipelines and metrics then report;
    # a whole number is read as its name ("0"), as some published config.json files write their labels
    bad = {k: v for k, v in labels.items()
           if not isinstance(v, str) and (isinstance(v, bool) or not isinstance(v, numbers.Integral))}
    if bad:
        raise BertkitError(f"BertConfig.id2label values must be label names (strings), got {bad}: name each label, "
                           "like {0: \"NEGATIVE\", 1: \"POSITIVE\"}")
    try:
        id2label = {int(k): str(v) if isinstance(v, str) else str(int(v)) for k, v in labels.items()}
    except (TypeError, ValueError):
        raise BertkitError(f"BertConfig.id2label keys must be label ids 0..n-1, got {list(labels)}") from None
    if sorted(id2label) != list(range(len(id2label))):
        raise BertkitError(f"BertConfig.id2label keys must be 0..n-1, got {sorted(id2label)}")
    return id2label


_dataclass_init = BertConfig.__init__


def _init(self: BertConfig, *args: Any, num_labels: int | None = None, label2id: dict[str, int] | None = None,
          **kwargs: Any) -> None:
    """The dataclass constructor, plus transformers' ``BertConfig(num_labels=3)`` and ``label2id=``."""
    unknown = sorted(set(kwargs) - _FIELDS - {"extra"})
    if unknown:  # transformers keeps any keyword as an attribute (a typo too) and writes it to config.json
        hints = "".join(f"; {_TRANSFORMERS_ONLY[k]}" for k in unknown if k in _TRANSFORMERS_ONLY)
        raise BertkitError(f"BertConfig got unknown keyword argument{'s' if len(unknown) > 1 else ''} "
                           f"{', '.join(unknown)}: not a field (fields: {', '.join(sorted(_FIELDS))}, or num_labels, "
                           f"label2id); a config.json's other keys are kept by BertConfig.from_dict(data){hints}")
    if label2id is not None and kwargs.get("id2label") is None:
        if not isinstance(label2id, dict):
            raise BertkitError(f"BertConfig.label2id must be a mapping like {{\"NEGATIVE\": 0}}, got {label2id!r}")
        kwargs["id2label"] = {v: k for k, v in label2id.items()}
    named = kwargs.get("id2label")
    if num_labels is not None and isinstance(named, dict) and len(named) != num_labels:
        # transformers warns "incompatible" and renames the labels LABEL_0..; from_pretrained kept the names and
        # dropped the count: either way one of the two the caller gave is lost
        raise BertkitError(f"num_labels={num_labels} but {len(named)} labels are named ({named}): pass the labels "
                           "alone (num_labels follows them), or as many labels as num_labels")
    _dataclass_init(self, *args, **kwargs)
    if num_labels is not None:
        self.num_labels = num_labels
        self._normalise_labels()  # the label count checked against problem_type, as __post_init__ checks id2label
    if label2id is not None and {v: k for k, v in label2id.items()} != self.id2label:
        raise BertkitError(f"label2id {label2id} does not invert id2label {self.id2label}: pass one of the two (the "
                           "other follows it), or two that name the same labels")


BertConfig.__init__ = _init  # type: ignore[method-assign]
_FIELDS = {f.name for f in dataclasses.fields(BertConfig)} - {"extra"}


def _shape(layers: int, hidden: int, heads: int) -> dict[str, int]:
    return {"num_hidden_layers": layers, "hidden_size": hidden, "num_attention_heads": heads,
            "intermediate_size": 4 * hidden}


PRESETS: dict[str, dict[str, int]] = {
    "tiny": _shape(2, 128, 2),
    "mini": _shape(4, 256, 4),
    "small": _shape(4, 512, 8),
    "medium": _shape(8, 512, 8),
    "base": _shape(12, 768, 12),
    "large": _shape(24, 1024, 16),
}
