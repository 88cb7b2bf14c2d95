"""What a sentence-transformers directory declares, read in one place.

``modules.json`` lists the modules (Transformer at "" or "0_Transformer", Pooling at 1_Pooling, Normalize at
2_Normalize); ``sentence_bert_config.json`` holds max_seq_length (where texts are cut) and do_lower_case;
``config_sentence_transformers.json`` the prompts, default_prompt_name, similarity_fn_name and truncate_dim (the
embedding's width), as sentence-transformers 6 writes them. ``SentenceTransformer``, the embedding pipelines (and
so ``bertkit predict`` and ``bertkit serve``) and ``CrossEncoder`` read a directory through ``read_directory``, so
that each gives the vectors the directory's model was trained and indexed with.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError
from bertkit.sentence.pooling import Pooling

MODULES = "modules.json"
ST_CONFIG = "config_sentence_transformers.json"
SBERT_CONFIG = "sentence_bert_config.json"
_TYPES = {"Transformer", "Pooling", "Normalize"}


def write_st_config(directory: Path, model_type: str, **fields: Any) -> None:
    """``config_sentence_transformers.json``: the versions that wrote it, ``model_type`` (SentenceTransformer,
    SparseEncoder, CrossEncoder) and the model's own ``fields`` (prompts, similarity, ...), as given."""
    import torch

    from bertkit import __version__
    from bertkit.outputs import atomic_write_json

    atomic_write_json(directory / ST_CONFIG, {"__version__": {"bertkit": __version__, "pytorch": torch.__version__},
                                              "model_type": model_type,
                                              **fields})


def module_types(modules: list[dict[str, Any]]) -> list[str]:
    """The modules' class names ("Transformer", "Pooling", ...) whatever package path recorded them."""
    return [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or None when there is no such file."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise BertkitError(f"{path} is not valid JSON ({e}); restore it from the model's source") from None


@dataclass(frozen=True)
class SentenceDirectory:
    """A directory's sentence-embedding settings; for a plain checkpoint (no modules.json) ``pooling`` is None and
    the rest their defaults."""

    path: Path
    encoder_dir: Path  # where config.json, the weights and the tokenizer are
    pooling: Pooling | None = None
    normalize: bool = False
    max_seq_length: int | None = None  # None: not declared (the tokenizer's and the positions' limit applies)
    do_lower_case: bool = False
    prompts: dict[str, str] = field(default_factory=dict)
    default_prompt_name: str | None = None
    similarity_fn_name: str | None = None
    truncate_dim: int | None = None

    @property
    def default_prompt(self) -> str | None:
        return self.prompts.get(self.default_prompt_name) if self.default_prompt_name is not None else None


def read_directory(path: str | Path) -> SentenceDirectory:
    """``path``'s sentence-transformers settings (``SentenceDirectory``). A module bertkit does not implement (Dense,
    a custom module) and a value that cannot be one are refused, naming the file."""
    path = Path(path)
    modules = read_json(path / MODULES)
    if modules is None:
        return SentenceDirectory(path, path)
    types = module_types(modules)
    unknown = [t for t in types if t not in _TYPES]
    if unknown or types[:2] != ["Transformer", "Pooling"] or types[2:] not in ([], ["Normalize"]):
        raise BertkitError(f"{path / MODULES} lists the modules {types}; bertkit implements Transformer, Pooling "
                           f"and an optional Normalize, in that order (not {unknown or types}); use "
                           "sentence-transformers for this model")
    encoder_dir = path / modules[0].get("path", "")
    pooling_file = path / modules[1]["path"] / "config.json"
    pooling = read_json(pooling_file)
    if pooling is None:
        raise FileNotFoundError(f"{pooling_file} is missing; {path / MODULES} lists a Pooling module there")
    sbert_file = encoder_dir / SBERT_CONFIG if (encoder_dir / SBERT_CONFIG).is_file() else path / SBERT_CONFIG
    sbert = read_json(sbert_file) or {}
    st = read_json(path / ST_CONFIG) or {}
    max_seq_length = declared_max_seq_length(sbert_file.parent)
    truncate_dim = _whole(st.get("truncate_dim"), "truncate_dim", path / ST_CONFIG)
    prompts = st.get("prompts") or {}
    if not (isinstance(prompts, dict) and all(isinstance(v, str) or v is None for v in prompts.values())):
        raise BertkitError(f"{path / ST_CONFIG}: prompts must be an object of strings, got {str(prompts)[:80]}")
    return SentenceDirectory(path, encoder_dir, Pooling.from_config(pooling, str(pooling_file)), len(types) == 3,
                             max_seq_length, bool(sbert.get("do_lower_case", False)), dict(prompts),
                             st.get("default_prompt_name"), st.get("similarity_fn_name"), truncate_dim)


def declared_max_seq_length(directory: str | Path) -> int | None:
    """The max_seq_length ``directory``'s sentence_bert_config.json declares, None where it declares none: where a
    Transformer module cuts its texts (or a cross-encoder its pairs), over the tokenizer's model_max_length, as
    sentence-transformers reads it."""
    sbert_file = Path(directory) / SBERT_CONFIG
    return _whole((read_json(sbert_file) or {}).get("max_seq_length"), "max_seq_length", sbert_file)


def _whole(value: Any, name: str, where: Path) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise BertkitError(f"{where}: {name} {value!r} must be a whole number >= 1 (or absent)")
    return value
