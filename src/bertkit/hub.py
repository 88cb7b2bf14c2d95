"""Hugging Face Hub ids where a checkpoint directory is expected (``bert-base-uncased``, ``org/name``).

A path that does not exist and looks like a Hub id is taken from huggingface_hub's cache (the snapshot refs/main
names; one cached in part is completed when online), else downloaded when that package is installed and the Hub
answers (probed first, so offline fails in seconds); otherwise the error says how to get the files. A
sentence-transformers repo (an embedder, a CrossEncoder, a SparseEncoder) comes with the files that make its vectors,
as sentence-transformers fetches them: modules.json first, its model's and its Transformer's settings, and each
module's folder (0_Transformer/ in older layouts, 1_Pooling/, 2_Dense/, ...). transformers'
options that pick other files (revision=, subfolder=, cache_dir=, ...) are refused, unless at their defaults, before
anything is read. ``read_modules`` is the one reader of a sentence-transformers directory's modules.json (with
``module_types`` and ``encoder_path``), for the Hub's files and every loader, quantize and export alike.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import socket
from pathlib import Path
from typing import Any

from bertkit.errors import BertkitError, MissingFileError, given_path, is_whole

# What a Hub repo id looks like: "name" or "owner/name", letters, digits, - _ . (no leading dot, no "..").
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")
# The files bertkit reads from a BERT repo (tokenizer.json first where there is one, as transformers); the rest
# (TF/Flax/ONNX weights, ...) is not downloaded.
_PATTERNS = ["config.json", "model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors",
             "tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"]
# transformers' torch pickle, fetched only where a repo has no safetensors weights, as transformers falls back to it
_PICKLE_PATTERNS = ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*-of-*.bin"]
# sentence-transformers' files at a repo's root: the module list, the model's settings (prompts, similarity) and a
# root Transformer's own (max_seq_length, do_lower_case); the modules' folders are fetched once modules.json names them
MODULES = "modules.json"
ST_CONFIG = "config_sentence_transformers.json"
SBERT_CONFIG = "sentence_bert_config.json"
SENTENCE_FILES = (MODULES, ST_CONFIG, SBERT_CONFIG)
# the modules that hold a BERT encoder: its files are fetched as a BERT repo's (no TF, Flax or ONNX weights)
_ENCODER_MODULES = {"Transformer", "MLMTransformer"}
PROBE_TIMEOUT_S = 3.0
logger = logging.getLogger("bertkit")
# transformers' from_pretrained keywords that choose where the files come from, at their defaults (or None, which
# transformers reads as the default): bertkit reads the directory, or the Hub id's main snapshot (its cache, else
# downloaded), which is what these defaults ask for. local_files_only=True is taken too: it only forbids the download.
HUB_OPTIONS = {"revision": "main", "subfolder": "", "cache_dir": None, "local_files_only": False, "token": None,
               "trust_remote_code": False, "force_download": False, "proxies": None}


def looks_like_hub_id(path: str | os.PathLike) -> bool:
    text = os.fspath(path)
    return bool(_HUB_ID.match(text)) and ".." not in text and not Path(text).exists()


def how_to_get(repo_id: str, what: str) -> str:
    return (f"{what} {repo_id!r} does not exist here{download_hint(repo_id)} (or `pip install huggingface_hub`: "
            "bertkit then downloads it itself when online)")


def refuse_hub_options(path: str | os.PathLike | None, options: dict) -> bool:
    """Take transformers' Hub keywords out of ``options``; one not at its default (another revision, a subfolder, a
    cache) is refused before any file is read or downloaded: resolving the main snapshot first would load (or
    download) other files than those asked for. Returns ``local_files_only`` (for ``resolve_directory``)."""
    local_files_only = options.get("local_files_only") is True
    if local_files_only:
        del options["local_files_only"]
    for name, default in HUB_OPTIONS.items():
        if name in options and options.pop(name) not in (default, None):  # None: transformers takes its default
            if path is not None and Path(path).exists():
                fix = (f"drop it and pass the directory to read ({os.fspath(path)} is local; for a subfolder, the "
                       "folder inside it)")
            else:
                fix = (f"fetch the files with `hf download {os.fspath(path or 'ID')} --revision REV --local-dir DIR` "
                       "(huggingface_hub's CLI), then pass DIR (DIR/SUBFOLDER for a subfolder)")
            raise BertkitError(f"from_pretrained({name}=...) is not implemented in bertkit (only {name}={default!r}, "
                               f"transformers' default): it reads a local directory, or a Hub id's main snapshot; {fix}")
    return local_files_only


def cache_hint(directory: Path) -> str:
    """For a file missing from ``directory``: when that is a snapshot in huggingface_hub's cache (which may hold part
    of a repo: transformers' AutoTokenizer caches no weights), how to fetch the rest ("" otherwise)."""
    repo = directory.parent.parent.name
    if directory.parent.name != "snapshots" or not repo.startswith("models--"):
        return ""
    repo_id = repo.removeprefix("models--").replace("--", "/")
    return (f" (huggingface_hub's cache of {repo_id}, holding part of it: fetch the rest with `hf download "
            f"{repo_id}`, or load it online)")


def download_hint(path: str | os.PathLike) -> str:
    """For a loader of local directories only: how to fetch ``path`` when it looks like a Hub id ("" otherwise)."""
    if not looks_like_hub_id(path):
        return ""
    return (f"; if {os.fspath(path)!r} is a Hugging Face Hub id, download it with `hf download {os.fspath(path)} "
            "--local-dir DIR` (huggingface_hub's CLI), then pass DIR")


def not_a_directory(directory: Path, what: str, fix: str) -> MissingFileError:
    """The error for a ``what`` path that is no directory, saying which way it is not: a file (its folder is wanted),
    a leading "~" (expanded by the shell, not by Python, nor by transformers), or nothing there."""
    if directory.is_file():
        return MissingFileError(f"{what} {directory} is a file; pass the directory that holds it ({directory.parent})")
    home = (" (a leading ~ is not expanded here, as in transformers: pass os.path.expanduser(path))"
            if os.fspath(directory).startswith("~") else "")
    return MissingFileError(f"{what} {directory} does not exist{home}; {fix}")


def _hub_reachable(endpoint: str) -> bool:
    host = re.sub(r"^https?://", "", endpoint).split("/")[0]
    host, _, port = host.partition(":")
    try:
        with socket.create_connection((host, int(port or 443)), timeout=PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def read_json(path: Path) -> Any:
    """The JSON in ``path``, or None when there is no such file."""
    if not path.is_file():
        return None
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:  # not JSON, or not UTF-8
        raise BertkitError(f"{path} is not valid JSON ({e}); restore it from the model's source") from None


def declared_max_seq_length(directory: str | Path) -> int | None:
    """The max_seq_length ``directory``'s sentence_bert_config.json declares, None where it declares none: where a
    Transformer module cuts its texts (or a cross-encoder its pairs), over the tokenizer's model_max_length, as
    sentence-transformers reads it."""
    sbert_file = Path(directory) / SBERT_CONFIG
    return declared_length(read_json(sbert_file) or {}, sbert_file)


def declared_length(sbert: dict[str, Any], sbert_file: Path | str) -> int | None:
    """A model_max_length in tokenizer_args (processor_kwargs), else max_seq_length, of the sentence_bert_config.json
    ``sbert``: sentence-transformers 6 gives max_seq_length to the tokenizer as its model_max_length only where its
    arguments set none."""
    given = [a for a in (sbert.get(k) for k in ("tokenizer_args", "processor_kwargs"))
             if isinstance(a, dict) and "model_max_length" in a]
    value = given[0]["model_max_length"] if given else sbert.get("max_seq_length")
    if value is not None and not is_whole(value):
        raise BertkitError(f"{sbert_file}: max_seq_length {value!r} must be a whole number >= 1 (or absent)")
    return value


def read_modules(directory: Path) -> list[dict[str, Any]] | None:
    """``directory``'s modules.json (None without one): a list of ``{"idx", "name", "path", "type"}`` objects, as
    sentence-transformers writes it; any other shape is refused naming the file (every reader indexes into it)."""
    modules = read_json(directory / MODULES)
    if modules is not None and not (isinstance(modules, list) and all(
            isinstance(m, dict) and isinstance(m.get("type"), str) and isinstance(m.get("path", ""), str)
            for m in modules)):
        raise BertkitError(f"{directory / MODULES} must be a list of modules ({{'idx', 'name', 'path', 'type'}} "
                           f"each), got {str(modules)[:80]}; restore it from the model's source")
    return modules


def module_types(modules: list[dict[str, Any]]) -> list[str]:
    """The modules' class names ("Transformer", "Pooling", ...) whatever path in sentence-transformers recorded them
    (``sentence_transformers.models.Pooling`` before 6). A module of another package keeps its whole path, so that
    no reader takes it for sentence-transformers' module of that name: a model's own ``custom_st.Transformer``
    (loaded by sentence-transformers with trust_remote_code) computes what its code says."""
    return [t.rsplit(".", 1)[-1] if t.startswith("sentence_transformers.") else t for t in (m["type"] for m in modules)]


def encoder_path(modules: list[dict[str, Any]] | None) -> str:
    """Where in a directory (relative to it) its encoder's config.json, weights and tokenizer are: the folder of the
    first module its modules.json lists, sentence-transformers' input module (the Transformer, in 0_Transformer/ in
    the older layout; a Router's routes), as sentence-transformers loads it; "" (the directory) without one."""
    return modules[0].get("path", "") if modules else ""


def _module_patterns(modules: list[dict[str, Any]]) -> list[str]:
    """The files of the modules in their own folders: an encoder's as a BERT repo's (with its
    sentence_bert_config.json), any other module's whole folder, as sentence-transformers' load_dir_path fetches it
    (a Pooling's config.json, a Dense's config and weights, a Router's routes)."""
    patterns: list[str] = []
    for module, kind in zip(modules, module_types(modules), strict=True):
        path = module.get("path", "")
        if path and kind in _ENCODER_MODULES:
            patterns += [f"{path}/{name}" for name in (*_PATTERNS, SBERT_CONFIG)]
        elif path:
            patterns.append(f"{path}/*")
    return patterns


def _encoder_whole(directory: Path) -> bool:
    weights = [*directory.glob("model*.safetensors"), *directory.glob("pytorch_model*.bin")]
    return (directory / "config.json").is_file() and bool(weights) and any(
        (directory / name).is_file() for name in ("vocab.txt", "tokenizer.json"))


def _module_whole(directory: Path, kind: str) -> bool:
    if kind in _ENCODER_MODULES:
        return _encoder_whole(directory)
    if kind == "Normalize":  # saved without files
        return True
    if kind == "Dense":
        return (directory / "config.json").is_file() and any(
            (directory / name).is_file() for name in ("model.safetensors", "pytorch_model.bin"))
    return directory.is_dir() and any(directory.iterdir())


def _in_snapshot(directory: Path) -> bool:
    return directory.parent.name == "snapshots" and directory.parent.parent.name.startswith("models--")


def _recorded_absent(snapshot: Path, name: str) -> bool:
    """Whether huggingface_hub's cache records that the repo of ``snapshot`` (a snapshot directory) has no file
    ``name`` (a path inside it) at that commit: a download asked for it by name (``.no_exist/<commit>/NAME``, as
    sentence-transformers and bertkit ask), or a snapshot download listed the repo (huggingface_hub 1.x's cached
    tree). False where the cache does not say: the file may be in the repo and not downloaded yet."""
    repo = snapshot.parent.parent
    if (repo / ".no_exist" / snapshot.name / name).is_file():
        return True
    try:  # huggingface_hub 1.x: the repo's listing, saved by snapshot_download
        from huggingface_hub import get_cached_repo_tree
        from huggingface_hub.errors import CachedRepoTreeNotFoundError
    except ImportError:
        return False
    repo_id = repo.name.removeprefix("models--").replace("--", "/")
    try:
        listed = get_cached_repo_tree(repo_id, revision=snapshot.name, cache_dir=repo.parent)
    except CachedRepoTreeNotFoundError:
        return False
    return all(f.path != name for f in listed)


def may_lack_sentence_files(directory: Path) -> bool:
    """Whether ``directory`` is a snapshot of huggingface_hub's cache without a modules.json that the cache does not
    record as missing from the repo, so that it may be a sentence-transformers repo cached in part: transformers
    caches such a repo's BERT files only (config, weights, tokenizer), and read from them alone its model would be a
    plain checkpoint's (another pooling, no prompt, no do_lower_case, another length)."""
    return (_in_snapshot(directory) and not (directory / MODULES).is_file()
            and not _recorded_absent(directory, MODULES))


def _whole(snapshot: Path) -> bool:
    """Whether a cached snapshot holds what bertkit reads: config, weights and tokenizer, and for a
    sentence-transformers repo every module's files. Another library may have cached part of a repo (transformers'
    AutoTokenizer caches config.json and the tokenizer files, no weights; its AutoModel a sentence-transformers repo's
    BERT files, no modules.json): such a snapshot is completed when online."""
    modules = read_modules(snapshot)
    if modules is None:
        return _encoder_whole(snapshot) and not may_lack_sentence_files(snapshot)
    kinds = zip(modules, module_types(modules), strict=True)
    encoder = encoder_path(modules)
    # the model's settings (prompts; max_seq_length, do_lower_case): without them its vectors are another model's
    settings = [ST_CONFIG, f"{encoder}/{SBERT_CONFIG}" if encoder else SBERT_CONFIG]
    return (all(_module_whole(snapshot / m.get("path", ""), kind) for m, kind in kinds)
            and _encoder_whole(snapshot / encoder)
            and all((snapshot / name).is_file() or _recorded_absent(snapshot, name) for name in settings))


def _download(repo_id: str) -> Path:
    """The repo's files bertkit reads, downloaded into huggingface_hub's cache: modules.json first, as
    sentence-transformers asks for it (where the repo has none, the cache records that), then the BERT files and
    sentence-transformers' settings, then any modules' folders; pytorch_model.bin only where an encoder has no
    safetensors weights (the Google miniatures'), as transformers falls back to it."""
    from huggingface_hub import hf_hub_download, snapshot_download
    from huggingface_hub.errors import EntryNotFoundError, LocalEntryNotFoundError

    try:
        modules_file = Path(hf_hub_download(repo_id, MODULES))
    except LocalEntryNotFoundError:  # the Hub did not answer: no sign that the repo lacks the file
        raise
    except EntryNotFoundError:  # the Hub says the repo has none: a plain checkpoint
        modules_file = None
    patterns = [*_PATTERNS, *SENTENCE_FILES]
    if modules_file is not None:
        patterns += _module_patterns(read_modules(modules_file.parent) or [])
    directory = Path(snapshot_download(repo_id, allow_patterns=patterns))
    encoder = encoder_path(read_modules(directory))
    if not any((directory / encoder).glob("model*.safetensors")):
        directory = Path(snapshot_download(repo_id, allow_patterns=[f"{encoder}/{name}" if encoder else name
                                                                    for name in _PICKLE_PATTERNS]))
    return directory


def resolve_directory(path: str | os.PathLike, what: str = "checkpoint directory",
                      local_files_only: bool = False) -> Path:
    """``path`` itself when it exists; for a Hub id, the snapshot directory (cache, else download unless
    ``local_files_only``), or a MissingFileError saying how to download it."""
    directory = given_path(path, what)
    if directory.is_dir() or not looks_like_hub_id(path):
        return directory  # the caller reports a missing directory in its own words
    repo_id = os.fspath(path)
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError, HFValidationError, LocalEntryNotFoundError
    except ImportError:
        raise MissingFileError(how_to_get(repo_id, what)) from None
    cached = None
    try:
        cached = Path(snapshot_download(repo_id, allow_patterns=_PATTERNS, local_files_only=True))
    except HFValidationError:  # "my--model", "x-", "name.git": no Hub id, so a local directory that is missing
        return directory
    except LocalEntryNotFoundError:
        pass  # not cached: try the network below
    if cached is not None and _whole(cached):
        return cached
    from huggingface_hub import constants

    if local_files_only or constants.HF_HUB_OFFLINE or not _hub_reachable(constants.ENDPOINT):
        if cached is not None:
            return cached  # what the cache holds; the caller names the file it lacks
        if local_files_only:
            why = "local_files_only=True"
        elif constants.HF_HUB_OFFLINE:  # said "the Hub is not reachable" of a Hub that was never asked
            switch = next((f"{name}={os.environ[name]}" for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
                           if os.environ.get(name)), "HF_HUB_OFFLINE")
            why = f"{switch} is set (huggingface_hub's offline mode: unset it to download)"
        else:
            why = f"the Hub ({constants.ENDPOINT}) is not reachable from here"
        raise MissingFileError(how_to_get(repo_id, what) + f"; {why} and the files are not in the local cache "
                               f"({constants.HF_HUB_CACHE})") from None
    try:
        return _download(repo_id)
    except (HfHubHTTPError, OSError) as e:
        if cached is not None and getattr(e, "errno", None) in (errno.EROFS, errno.EACCES, errno.EPERM):
            # a read-only cache (a container's, a shared one): transformers reads what it holds there, and so does
            # bertkit offline; failing here made the same snapshot load offline but not online
            logger.warning("huggingface_hub's cache holding %s cannot be written (%s: %s), so the files bertkit "
                           "also reads from it (modules.json, ...) were not fetched: reading the %s it holds",
                           repo_id, e.strerror, e.filename, cached)
            return cached  # what the cache holds; the caller names the file it lacks
        raise MissingFileError(how_to_get(repo_id, what) + f"; downloading it failed: {str(e).splitlines()[0]}"
                               ) from None
