"""Training checkpoints on disk: ``state.pt`` (optimiser, scheduler, scaler, every rank's RNG state, the loop's
position, the run's fingerprint) and the model in the Hugging Face layout, written into a staging directory and
renamed into place with a manifest of its files; rotation removes only the files a manifest proves bertkit's. The
weights are stored once: in ``model.safetensors``, which ``state.pt`` names, where the model writes one holding all of
them (checkpoints written before hold them in ``state.pt`` too, and resume as they did); in ``state.pt`` otherwise
(a sentence-transformers loss, whose model is not one bertkit's ``save_pretrained`` writes). ``bertkit.Trainer``'s
checkpoints also hold transformers' Trainer's own resume files (optimizer.pt, which ``state.pt`` names in turn,
scheduler.pt, rng_state.pth), so either library continues them; the sentence trainers' hold them in the parameter
groups of sentence-transformers' trainers (``OptimizerLayout``); another library's checkpoints, which hold no
``state.pt``, are refused by name (``resume_point.foreign_checkpoint``).
"""

from __future__ import annotations

import logging
import os
import pickle
import random
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from bertkit._parallel import DistInfo
from bertkit.errors import BertkitError
from bertkit.manifests import read_marker, remove_owned_tree
from bertkit.outputs import MARKER, as_placed, disk_full, fsync, why_full
from bertkit.staging import remove_killed_writes, staged
from bertkit.training.optim import named_groups
from bertkit.weight_files import WEIGHTS_NAME

logger = logging.getLogger("bertkit")

STATE_FILE = "state.pt"
# state.pt's layout, recorded in it as "format" from 2 on (1: unmarked, bertkit until 2026-11-30; 2 may name the
# checkpoint's optimizer.pt for the optimiser state, as it names model.safetensors for the weights; 3 from 2026-12-02).
# A state of a newer format is refused by name; entries an older one did not record yet (FIRST_RECORDED) are named as
# such on resume.
STATE_FORMAT = 3
# 2: fine-tuning's label names and training data digest, the sentence trainers' loss settings; 3: the sentence
# trainers' model modules (their settings, an encoder's config)
FIRST_RECORDED = {2: ("labels", "train_data", "loss"), 3: ("modules",)}


@dataclass(frozen=True)
class CheckpointLayout:
    """Where checkpoints live: ``OUT/checkpoints/step-00000010`` (the commands'), or ``OUT/checkpoint-10``
    (``HF_LAYOUT``, transformers' Trainer's, which ``bertkit.Trainer`` writes)."""

    subdir: str = "checkpoints"
    prefix: str = "step-"
    digits: int = 8

    def root(self, out_dir: Path) -> Path:
        return out_dir / self.subdir if self.subdir else out_dir

    def path(self, out_dir: Path, step: int) -> Path:
        return self.root(out_dir) / f"{self.prefix}{str(step).zfill(self.digits)}"

    def dirs(self, out_dir: Path) -> list[Path]:
        found = [(step, p) for p in self.root(out_dir).glob(f"{self.prefix}*")
                 if p.is_dir() and (step := checkpoint_step(p.name, self.prefix)) is not None]
        return [p for _, p in sorted(found, key=lambda found: found[0])]


def checkpoint_step(name: str, prefix: str) -> int | None:
    """The step a checkpoint directory's name gives (``checkpoint-12`` -> 12), or None for a name bertkit never writes:
    ASCII digits only, as transformers' ``[0-9]+`` reads them (``str.isdigit`` takes ``checkpoint-²``, which ``int``
    then refuses with a ValueError, and reads ``checkpoint-٦`` as step 6: a user's directory taken for a checkpoint)."""
    digits = name[len(prefix):] if name.startswith(prefix) else ""
    return int(digits) if re.fullmatch("[0-9]+", digits) else None


STEP_LAYOUT = CheckpointLayout()
HF_LAYOUT = CheckpointLayout(subdir="", prefix="checkpoint-", digits=0)


def save_checkpoint(out_dir: Path, state: dict, step: int, keep: int, model: nn.Module | None = None, *,
                    layout: CheckpointLayout = STEP_LAYOUT, write_extra: Callable[[Path], None] | None = None,
                    protect: Callable[[Path], bool] | None = None,
                    transformers_files: bool | OptimizerLayout = False, model_only: bool = False) -> Path:
    """Write ``state`` (and ``model``, for ``from_pretrained``) into a staging directory beside the checkpoint, its
    manifest last, and rename it into place (``bertkit.staging.staged``): a kill or a full disk mid-write leaves the
    previous checkpoints as they were. ``write_extra(dir)`` adds files before the rename; then ``keep`` checkpoints
    are kept (``_rotate``). ``transformers_files``: also transformers' Trainer's own resume files
    (``_write_transformers_files``), the optimiser's moments stored there once (an ``OptimizerLayout``: in the
    parameter groups of the trainer that reads them, which state.pt records to read them back). ``model_only``
    (transformers' ``save_only_model``): the model and ``write_extra``'s files alone, without state.pt or the resume
    files, as transformers writes such a checkpoint; no run resumes from it (``refuse_model_only``)."""
    final = layout.path(out_dir, step)
    if model_only:
        assert hasattr(model, "save_pretrained"), "a model-only checkpoint is the model's save_pretrained"
        with staged(final, "checkpoint", manifest=True) as tmp:
            model.save_pretrained(tmp)
            if write_extra is not None:
                write_extra(tmp)
        _rotate(out_dir, layout, final, keep, protect)
        return final
    state = {**state, "format": STATE_FORMAT}
    weights, whole = state["model"], state
    if model is not None and _aliases(model, _published(model)) is not None:
        state = {**state, "model": WEIGHTS_NAME}  # save_pretrained writes them all: not twice (a third of the bytes)
    if transformers_files:  # as the weights: once, in the file transformers reads, in its reader's layout
        state = {**state, "optimizer": OPTIMIZER_FILE,
                 **(transformers_files.stored(state["optimizer"])
                    if isinstance(transformers_files, OptimizerLayout) else {})}
        whole = {**whole, **_relaid(whole, transformers_files)}
    try:
        with staged(final, "checkpoint", manifest=True) as tmp:
            torch.save(state, tmp / STATE_FILE)  # a file of the staging directory: removed with it if cut short
            fsync(tmp / STATE_FILE)
            if transformers_files:
                _write_transformers_files(tmp, whole)
            if model is not None and hasattr(model, "save_pretrained"):
                model.save_pretrained(tmp)
            if write_extra is not None:
                write_extra(tmp)
    except BertkitError as e:
        if e.__cause__ is None or not disk_full(e.__cause__):
            raise
        raise _disk_full_error(out_dir, layout, final, weights, e.errno) from e.__cause__
    _rotate(out_dir, layout, final, keep, protect)
    return final


OPTIMIZER_FILE, SCHEDULER_FILE = "optimizer.pt", "scheduler.pt"  # transformers' Trainer's names


@dataclass(frozen=True)
class OptimizerLayout:
    """The parameter groups of the trainer that resumes a checkpoint's optimizer.pt, over bertkit's optimiser:
    sentence-transformers' trainers train the pooler, which bertkit's freeze (it gets no gradient, and DDP refuses
    a parameter without one), so their groups list parameters bertkit's do not, and torch refuses a state of other
    group sizes. ``groups``: for each of their groups, the place of bertkit's group holding the same parameters (None
    where bertkit has none: a ``learning_rate_mapping`` pattern matching only frozen parameters), each parameter's
    index in bertkit's state dict (None: not in bertkit's optimiser, so without moments, as AdamW keeps none for a
    parameter without a gradient), and the group's options where bertkit has no group. ``withheld``: bertkit's
    parameters (by group, then index) that the reader's groups leave out: a loss's own (SoftmaxLoss's classifier),
    whose weights sentence-transformers' trainers do not restore, so that they refuse the file (its groups are
    smaller than theirs) rather than go on with a classifier drawn anew; their moments stay in state.pt."""

    groups: tuple[tuple[int | None, tuple[int | None, ...], dict], ...]
    withheld: tuple[tuple[int, tuple[int, ...]], ...] = ()

    def stored(self, optimizer: dict) -> dict:
        """What state.pt records (ints, which ``torch.load(weights_only=True)`` reads) to read optimizer.pt back, and
        the withheld parameters' moments."""
        return {"optimizer_layout": [[-1 if g is None else g, [-1 if i is None else i for i in params]]
                                     for g, params, _ in self.groups],
                **({"optimizer_withheld": {"groups": {g: list(params) for g, params in self.withheld},
                                           "state": {i: optimizer["state"][i] for _, params in self.withheld
                                                     for i in params if i in optimizer["state"]}}}
                   if self.withheld else {})}


def optimizer_layout(model: nn.Module, weight_decay: float, learning_rates: dict[str, float] | None,
                     frozen: set[nn.Parameter], restored: set[nn.Parameter]) -> OptimizerLayout:
    """The groups of sentence-transformers' trainers (``optim.named_groups``), where bertkit's trainer froze the
    parameters ``frozen``, over those of bertkit's optimiser on ``model``, matched by parameter name; the parameters
    their resume does not restore (not in ``restored``, the model's) are withheld from them."""
    frozen_names = frozenset(n for n, p in model.named_parameters() if p in frozen)  # parameters hash by identity
    left_out = {n for n, p in model.named_parameters() if p not in restored}
    ours = named_groups(model, weight_decay, learning_rates)
    index = {n: i for i, n in enumerate(n for _, names, _ in ours for n in names)}  # torch's numbering: group order
    place = {p: g for g, (p, _, _) in enumerate(ours)}
    theirs = named_groups(model, weight_decay, learning_rates, frozen_names)
    return OptimizerLayout(
        tuple((place.get(p), tuple(index.get(n) for n in names if n not in left_out), options)
              for p, names, options in theirs),
        tuple((g, tuple(index[n] for n in names if n in left_out)) for g, (_, names, _) in enumerate(ours)
              if any(n in left_out for n in names)))


def _relaid(state: dict, layout: bool | OptimizerLayout) -> dict:
    """``state``'s optimiser and scheduler in ``layout``'s groups (as they are for True: transformers' own)."""
    if not isinstance(layout, OptimizerLayout):
        return {}
    optimizer, scheduler = state["optimizer"], state["scheduler"]
    first = optimizer["param_groups"][0]
    scale = first["lr"] / first["initial_lr"] if first.get("initial_lr") else 0.0  # where the schedule is now
    groups, moments, lists = [], {}, {}
    for source, params, options in layout.groups:
        if source is None:
            group = {**first, **options, "initial_lr": options["lr"], "lr": options["lr"] * scale}
        else:
            group = optimizer["param_groups"][source]
        start = sum(len(g["params"]) for g in groups)  # torch numbers parameters across the groups in order
        ids = list(range(start, start + len(params)))
        moments.update({i: optimizer["state"][b] for i, b in zip(ids, params) if b is not None and b in optimizer["state"]})
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": ids})
        for key in ("base_lrs", "_last_lr", "lr_lambdas"):  # the LambdaLR's values per group
            if isinstance(scheduler.get(key), list):
                mine = {"base_lrs": group["initial_lr"] if source is None else None, "_last_lr": group["lr"],
                        "lr_lambdas": None}[key]
                lists.setdefault(key, []).append(scheduler[key][source] if source is not None else mine)
    return {"optimizer": {"state": moments, "param_groups": groups}, "scheduler": {**scheduler, **lists}}


def _read_back(saved: dict, stored: list[list], withheld: dict | None = None) -> dict:
    """An optimizer.pt written in another trainer's groups (``OptimizerLayout.stored``) in bertkit's groups again,
    with the moments state.pt holds of the parameters left out of them (``withheld``)."""
    groups: dict[int, dict] = {}
    moments: dict[int, dict] = dict((withheld or {}).get("state", {}))
    for (source, params), group in zip(stored, saved["param_groups"]):
        if source < 0:
            continue
        groups[source] = {**{k: v for k, v in group.items() if k != "params"},
                          "params": sorted([b for b in params if b >= 0]
                                           + list((withheld or {}).get("groups", {}).get(source, [])))}
        moments.update({b: saved["state"][i] for i, b in zip(group["params"], params)
                        if b >= 0 and i in saved["state"]})
    return {"state": moments, "param_groups": [groups[g] for g in sorted(groups)]}


def _write_transformers_files(directory: Path, state: dict) -> None:
    """What transformers' Trainer resumes from, written as it writes them, so its
    ``train(resume_from_checkpoint=...)`` on a bertkit checkpoint continues this run (it reads no state.pt, and
    without these went on with a fresh AdamW and the schedule from its first step, without a word): optimizer.pt,
    AdamW's state dict, whose parameter groups and order are transformers' own (``optim.parameter_groups``), or
    sentence-transformers' (``state`` laid out by ``_relaid``); scheduler.pt, the LambdaLR's, at the same step;
    each rank's random states as transformers names them (rng_state.pth, or rng_state_N.pth for N ranks; numpy's,
    which bertkit's training never draws from, as it is). Each is synced to disk before the checkpoint is placed."""
    torch.save(state["optimizer"], directory / OPTIMIZER_FILE)
    torch.save(state["scheduler"], directory / SCHEDULER_FILE)
    written, ranks = [OPTIMIZER_FILE, SCHEDULER_FILE], state["rank_rng"]
    for rank, rng in enumerate(ranks):
        written.append("rng_state.pth" if len(ranks) == 1 else f"rng_state_{rank}.pth")
        torch.save({"python": rng["python"], "numpy": np.random.get_state(), "cpu": rng["torch"],
                    **({"cuda": rng["cuda"]} if "cuda" in rng else {})}, directory / written[-1])
    for name in written:
        fsync(directory / name)


def _disk_full_error(out_dir: Path, layout: CheckpointLayout, final: Path, weights: dict, code: int) -> BertkitError:
    """In the system's words (``code``: a quota or a limit on a file's size refuses a write on a disk with room), naming
    the checkpoint where it would be once the command's run is in place."""
    previous = layout.dirs(out_dir)
    needed = sum(t.numel() * t.element_size() for t in weights.values()) * 3  # weights + 2 Adam moments
    free = shutil.disk_usage(out_dir).free  # the run's own directory: the failed write removed the ones it made
    kept = f"the previous checkpoint {as_placed(str(previous[-1]))} is intact" if previous else "nothing else was changed"
    cause, fix = why_full(code)
    # bertkit.Trainer's checkpoints (transformers' layout) are resumed from Python, the commands' with a flag
    resume = "trainer.train(resume_from_checkpoint=True)" if layout == HF_LAYOUT else "--resume"
    return BertkitError(
        f"{os.strerror(code)}: could not write the checkpoint {as_placed(str(final))} (it needs about "
        f"{needed / 1e6:.0f} MB, {free / 1e6:.0f} MB are free): {cause}; the temporary files were removed and {kept}: "
        f"{fix} with {resume}"
    )


def remove_torn_writes(out_dir: Path, layout: CheckpointLayout) -> None:
    """Remove the checkpoint writes a kill cut short (their staging directories, which no process holds)."""
    remove_killed_writes(layout.root(out_dir), layout.prefix)


def _rotate(out_dir: Path, layout: CheckpointLayout, final: Path, keep: int,
            protect: Callable[[Path], bool] | None) -> None:
    """transformers' ``save_total_limit``: ``keep`` checkpoints in all, among them always ``final`` (the one just
    written) and the one ``protect`` claims (the best), so two when those differ and ``keep`` is 1; the others go
    oldest first. A directory without a checkpoint manifest (a user's empty ``checkpoint-999``) is not bertkit's: it
    is neither counted nor removed, and never makes the checkpoint just written look old; nor is one whose manifest
    cannot be read (damaged): it proves nothing, and a run that stopped on it would stop again at each resume."""
    ours = [p for p in layout.dirs(out_dir) if (p / MARKER).is_file() and _provable(p)]
    kept = {final, *(p for p in ours if protect is not None and protect(p))}
    others = [p for p in ours if p not in kept]
    for old in others[:max(0, len(others) - max(0, keep - len(kept)))]:
        remove_checkpoint(old)


def remove_checkpoint(path: Path) -> None:
    """Remove the checkpoint at ``path``: only the files recorded as written by this run or the one it resumes, its
    state.pt first, so that what a kill leaves of the removal lacks it (``resume_point.removal_cut_short``)."""
    remove_owned_tree(path, first=(STATE_FILE,))


def _provable(path: Path) -> bool:
    try:
        return read_marker(path) is not None
    except BertkitError as e:
        logger.warning("kept %s, not counted among the checkpoints save_total_limit keeps: %s", path, e)
        return False


def model_state(model: nn.Module) -> dict:
    """The model's state dict as views of the parameters (keep_vars): torch.save writes tied embeddings once."""
    return {k: v.detach() for k, v in model.state_dict(keep_vars=True).items()}


def _published(model: nn.Module) -> set[str]:
    """The state-dict names ``model.save_pretrained`` writes to model.safetensors (none: a model it does not write)."""
    keys = getattr(model, "_published_keys", None)
    return {key for part in keys() for key in part} if callable(keys) and hasattr(model, "save_pretrained") else set()


def _aliases(model: nn.Module, stored: set[str]) -> dict[str, str] | None:
    """For each state-dict name of ``model`` not in ``stored``, the stored name of the same tensor (a masked-LM
    decoder is tied to the word embeddings); None when some tensor is not stored under any name."""
    if not stored:
        return None
    own = model.state_dict(keep_vars=True)
    aliases = {}
    for key, tensor in own.items():
        if key not in stored:
            same = next((name for name in stored if own.get(name) is tensor), None)
            if same is None:
                return None
            aliases[key] = same
    return aliases


def load_model_state(model: nn.Module, weights: dict) -> None:
    """A checkpoint's weights into ``model``: all of its state dict, or (read from model.safetensors) one name of
    each tied tensor, the others filled from it."""
    aliases = _aliases(model, set(weights)) or {}
    model.load_state_dict({**weights, **{key: weights[name] for key, name in aliases.items()}})


def optimizer_parameters(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[list[str]]:
    """The names (``model.named_parameters()``'s) of the parameters each of ``optimizer``'s groups trains, in order:
    a checkpoint records them, so that a resume whose model trains other parameters is refused by name."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [[names.get(id(p), "?") for p in g["params"]] for g in optimizer.param_groups]


def load_optimizer_state(optimizer: torch.optim.Optimizer, state: dict, trained: list[list[str]] | None = None,
                         saved_trained: list[list[str]] | None = None) -> None:
    """Load AdamW's state; ``trained`` and ``saved_trained`` (``optimizer_parameters`` now and in the checkpoint,
    None where a checkpoint written before it was recorded holds none) must name the same parameters: torch hands
    the moments out by position, so a model that freezes other tensors of the same shapes (requires_grad) would take
    another tensor's moments without a word."""
    saved = [len(g["params"]) for g in state.get("param_groups", [])]
    now = [len(g["params"]) for g in optimizer.param_groups]
    if saved != now:  # torch's own message names no cause; a different parameter layout is the usual one
        raise BertkitError(
            f"the checkpoint's optimiser state holds parameter groups of {saved} tensors, this model's "
            f"optimiser {now}: it was written for another model, so the run cannot be resumed; start a new "
            "run (its model files can still initialise one)")
    if trained is not None and saved_trained is not None and trained != saved_trained:
        before, after = {n for g in saved_trained for n in g}, {n for g in trained for n in g}
        what = (f"the checkpoint's trains {_few(before - after)}, which this run's does not, and this run's trains "
                f"{_few(after - before)}" if before != after else
                "the same parameters in other groups (other weight decay or learning-rate groups)")
        raise BertkitError(
            f"the checkpoint's optimiser and this run's train other parameters ({what}): the model's trainable "
            "parameters (requires_grad) differ from the run that wrote it, and AdamW's moments would go to other "
            "tensors; freeze the parameters that run froze, or start a new run (its model files can still "
            "initialise one)")
    optimizer.load_state_dict(state)


def _few(names: set[str]) -> str:
    shown = sorted(names)
    return repr(shown[:4])[:-1] + (f", ... ({len(shown)} in all)]" if len(shown) > 4 else "]") if shown else "none"


def rng_state(device: str) -> dict:
    state = {"torch": torch.get_rng_state(), "python": random.getstate()}
    if torch.device(device).type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(torch.device(device))
    return state


def set_rng_state(state: dict, device: str) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    if "cuda" in state and torch.device(device).type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], torch.device(device))


def read_state(path: Path) -> dict:
    try:
        state = torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as e:
        raise BertkitError(f"{path / STATE_FILE} holds Python code, not only tensors, so bertkit will not load it "
                           f"(it did not write it): {str(e).splitlines()[0]}") from None
    missing = {"model", "optimizer", "scheduler", "scaler", "position", "fingerprint", "rank_rng", "world_size",
               "windows"} - state.keys()
    if missing:
        raise KeyError(sorted(missing))
    if state.get("format", 1) > STATE_FORMAT:
        raise BertkitError(f"{path / STATE_FILE} is of checkpoint format {state['format']}, written by a newer bertkit "
                           f"(this one reads formats 1 to {STATE_FORMAT}): resume it with that version, or upgrade")
    if isinstance(state["model"], str):  # the weights are in the checkpoint's model.safetensors
        state["model"] = _read_weights(path, state["model"])
    if isinstance(state["optimizer"], str):  # AdamW's moments are in the checkpoint's optimizer.pt
        state["optimizer"] = _read_optimizer(path, state["optimizer"])
        if "optimizer_layout" in state:  # ... in the groups of sentence-transformers' trainers
            state["optimizer"] = _read_back(state["optimizer"], state["optimizer_layout"], state.get("optimizer_withheld"))
    return state


def checkpoint_weights(path: Path) -> dict:
    """The weights of the checkpoint at ``path``: state.pt's, or a model-only checkpoint's model.safetensors."""
    return read_state(path)["model"] if (path / STATE_FILE).is_file() else _read_weights(path, WEIGHTS_NAME)


def refuse_model_only(path: Path) -> None:
    """Refuse to resume ``path`` where it was written with transformers' ``save_only_model`` (the model and
    trainer_state.json, neither state.pt nor optimizer.pt): transformers' Trainer goes on from one with a fresh AdamW
    and the schedule from its first step, without a word, which trains another model."""
    if ((path / WEIGHTS_NAME).is_file() and (path / "trainer_state.json").is_file()
            and not (path / STATE_FILE).exists() and not (path / OPTIMIZER_FILE).exists()):
        raise BertkitError(f"resume_from_checkpoint: {path} was written with save_only_model=True and holds the model "
                           "without the optimiser, schedule and random states, so it cannot continue the run "
                           "(transformers' Trainer would go on with a fresh optimiser and the schedule from its first "
                           f"step); start a new run from its weights, from_pretrained({str(path)!r}), in another "
                           "output_dir, or train with save_only_model=False to write resumable checkpoints")


def _read_optimizer(path: Path, name: str) -> dict:
    """The optimiser state a checkpoint's state.pt names; damage is a ValueError, as for the weights."""
    if name != OPTIMIZER_FILE:
        raise ValueError(f"state.pt names {name!r} as the file of its optimiser state, not {OPTIMIZER_FILE}")
    if not (path / name).is_file():  # (transformers' users delete optimizer.pt to keep a checkpoint small)
        raise ValueError(f"{path / name} is missing: it holds AdamW's moments, which state.pt leaves to it; put it "
                         "back, or resume from an earlier checkpoint by its path")
    try:
        return torch.load(path / name, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as e:  # (a torn file: torch names no file)
        raise ValueError(f"{path / name}: {str(e).splitlines()[0]}") from None


def _read_weights(path: Path, name: str) -> dict:
    """The weights a checkpoint's state.pt names; damage is a ValueError, so a resume falls back to the checkpoint
    before (``resume_point.checkpoint_to_resume``)."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    if name != WEIGHTS_NAME:
        raise ValueError(f"state.pt names {name!r} as the file of its weights, not {WEIGHTS_NAME}")
    try:
        return load_file(str(path / name))
    except SafetensorError as e:
        raise ValueError(f"{path / name}: {e}") from None


def restore_rank_state(state: dict, info: DistInfo, seed: int, step: int, device: str) -> dict:
    """This rank's RNG state and logging window from a checkpoint; returns the window. With another world size
    there is no RNG state for the new ranks: each is re-seeded from (seed, rank, step)."""
    ranks, windows = state["rank_rng"], state["windows"]
    if len(ranks) == info.world_size:
        set_rng_state(ranks[info.rank], device)
        return dict(windows[info.rank])
    torch.manual_seed(seed + info.rank + 7919 * step)
    random.seed(seed + info.rank + 7919 * step)
    combined: dict = {}  # every rank's partial logging window, summed on rank 0
    for w in windows if info.is_main else []:
        for k, v in w.items():
            combined[k] = combined.get(k, 0.0) + v
    return combined
