"""Every command's settings, each defined once: one typed tree from which the command line is derived.

The command line (``bertkit.cli``) turns each field into one flag, its attribute docstring into the help, and
its default into the shown default, so a default is written here and nowhere else. ``fields`` holds the one
field helper (``flag``: flag spellings, the field's check, the commands it is a flag of and, for a training knob,
transformers' default), the checks and the field groups several commands share; ``training``, ``inference`` and
``data`` hold the commands' settings. ``training.TrainingSettings`` declares every knob of the training loop once:
``bertkit.TrainingArguments`` is derived from it. Every public name is importable from here.

Why not jsonargparse, tyro or simple-parsing: they do this well, but the core depends on torch, numpy,
safetensors and tqdm only, and the generator bertkit needs (dataclass field -> argparse flag) is one
module, ``bertkit.cli_flags``. Nothing here imports torch: ``bertkit --help`` stays fast.
"""

from __future__ import annotations

from bertkit.settings.data import (
    CreateDataSettings,
    DownloadSettings,
    TokenizerSettings,
)
from bertkit.settings.fields import (
    LR_SCHEDULES,
    MINIATURE_GRID,
    PAPER_GRID,
    SMALL_MODEL_LR,
    Int8Settings,
    OverwriteSettings,
    ProgressSettings,
    SquadWindowSettings,
    checkpoint_fields,
    coerce_paths,
    default_lr,
    flag,
    parse_lr_grid,
    parse_one_lr,
    resume_fingerprint,
)
from bertkit.settings.inference import (
    ConvertTfSettings,
    ExportOnnxSettings,
    ExtractSettings,
    PredictBenchmarkSettings,
    PredictFileSettings,
    PredictGlueSettings,
    PredictNerSettings,
    PredictSquadSettings,
    PredictSwagSettings,
    QuantizeSettings,
    ServeSettings,
)
from bertkit.settings.training import (
    SQUAD_PAPER,
    STUDY_COMBINATIONS,
    ClassifySettings,
    DemoSettings,
    FinetuneSettings,
    GlueSettings,
    NerSettings,
    PretrainSettings,
    SequenceClassificationSettings,
    SquadSettings,
    StudySettings,
    SwagSettings,
    TrainingSettings,
    first,
)

__all__ = [
    "ClassifySettings",
    "ConvertTfSettings",
    "CreateDataSettings",
    "DemoSettings",
    "DownloadSettings",
    "ExportOnnxSettings",
    "ExtractSettings",
    "FinetuneSettings",
    "GlueSettings",
    "Int8Settings",
    "LR_SCHEDULES",
    "MINIATURE_GRID",
    "NerSettings",
    "OverwriteSettings",
    "PAPER_GRID",
    "PredictBenchmarkSettings",
    "PredictFileSettings",
    "PredictGlueSettings",
    "PredictNerSettings",
    "PredictSquadSettings",
    "PredictSwagSettings",
    "QuantizeSettings",
    "PretrainSettings",
    "ProgressSettings",
    "SMALL_MODEL_LR",
    "SQUAD_PAPER",
    "STUDY_COMBINATIONS",
    "SequenceClassificationSettings",
    "ServeSettings",
    "SquadSettings",
    "SquadWindowSettings",
    "StudySettings",
    "SwagSettings",
    "TokenizerSettings",
    "TrainingSettings",
    "checkpoint_fields",
    "coerce_paths",
    "default_lr",
    "first",
    "flag",
    "parse_lr_grid",
    "parse_one_lr",
    "resume_fingerprint",
]
