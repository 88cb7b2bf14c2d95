"""Hugging Face Hub ids where a checkpoint directory is expected (``bert-base-uncased``, ``org/name``).

A path that does not exist and looks like a Hub id is taken from huggingface_hub's cache (the snapshot refs/main
names; one cached in part is completed when online), else downloaded when that package is installed and the Hub
answers (probed first, so offline fails in seconds); otherwise the error says how to get the files. transformers'
options that pick other files (revision=, subfolder=, cache_dir=, ...) are refused, unless at their defaults, before
anything is read.
"""

from __future__ import annotations

import os
import re
import socket
from pathlib import Path

from bertkit.errors import BertkitError, MissingFileError, given_path

# What a Hub repo id looks like: "name" or "owner/name", letters, digits, - _ . (no leading dot, no "..").
_HUB_ID = re.compile(r"^(?:[A-Za-z0-9][\w.-]{0,95}/)?[A-Za-z0-9][\w.-]{0,95}$")
# The files bertkit reads from a BERT repo (tokenizer.json first where there is one, as transformers); the rest
# (TF/Flax/ONNX weights, ...) is not downloaded.
_PATTERNS = ["config.json", "model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors",
             "tokenizer.json", "vocab.txt", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json"]
# transformers' torch pickle, fetched only where a repo has no safetensors weights, as transformers falls back to it
_PICKLE_PATTERNS = ["pytorch_model.bin", "pytorch_model.bin.index.json", "pytorch_model-*-of-*.bin"]
PROBE_TIMEOUT_S = 3.0
# transformers' from_pretrained keywords that choose where the files come from, at their defaults (or None, which
# transformers reads as the default): bertkit reads the directory, or the Hub id's main snapshot (its cache, else
# downloaded), which is what these defaults ask for.
HUB_OPTIONS = {"revision": "main", "subfolder": "", "cache_dir": None, "local_files_only": False, "token": None,
               "trust_remote_code": False, "force_download": False, "proxies": None}


def looks_like_hub_id(path: str | os.PathLike) -> bool:
    text = os.fspath(path)
    return bool(_HUB_ID.match(text)) and ".." not in text and not Path(text).exists()


def how_to_get(repo_id: str, what: str) -> str:
    return (f"{what} {repo_id!r} does not exist here{download_hint(repo_id)} (or `pip install huggingface_hub`: "
            "bertkit then downloads it itself when online)")


def refuse_hub_options(path: str | os.PathLike | None, options: dict) -> None:
    """Take transformers' Hub keywords out of ``options``; one not at its default (another revision, a subfolder, a
    cache) is refused before any file is read or downloaded: resolving the main snapshot first would load (or
    download) other files than those asked for."""
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


def _whole(snapshot: Path) -> bool:
    """Whether a cached snapshot holds config, weights and tokenizer: another library may have cached part of a repo
    (transformers' AutoTokenizer caches config.json and the tokenizer files, no weights)."""
    weights = [*snapshot.glob("model*.safetensors"), *snapshot.glob("pytorch_model*.bin")]
    return (snapshot / "config.json").is_file() and bool(weights) and any(
        (snapshot / name).is_file() for name in ("vocab.txt", "tokenizer.json"))


def resolve_directory(path: str | os.PathLike, what: str = "checkpoint directory") -> Path:
    """``path`` itself when it exists; for a Hub id, the snapshot directory (cache, else download), or a
    MissingFileError saying how to download it."""
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

    if constants.HF_HUB_OFFLINE or not _hub_reachable(constants.ENDPOINT):
        if cached is not None:
            return cached  # what the cache holds; the caller names the file it lacks
        raise MissingFileError(how_to_get(repo_id, what) + f"; the Hub ({constants.ENDPOINT}) is not reachable "
                               "from here and the files are not in the local cache") from None
    try:
        directory = Path(snapshot_download(repo_id, allow_patterns=_PATTERNS))
        if not any(directory.glob("model*.safetensors")):  # a repo from before safetensors (the Google miniatures'):
            directory = Path(snapshot_download(repo_id, allow_patterns=_PICKLE_PATTERNS))  # transformers' fallback
        return directory
    except (HfHubHTTPError, OSError) as e:
        raise MissingFileError(how_to_get(repo_id, what) + f"; downloading it failed: {str(e).splitlines()[0]}"
                               ) from None
