"""Every command's settings, each field declared once: its flag, config-file key and help (its attribute docstring)
come from it (``bertkit.cli_flags``), and ``bertkit.TrainingArguments`` from ``training.TrainingSettings``.

``fields`` holds the field helper ``flag``, the checks and the field groups several commands share; ``training``,
``inference`` and ``data`` the commands' settings. Nothing here imports torch: ``bertkit --help`` stays fast.
(jsonargparse or tyro would generate the flags too, but the core depends on torch, numpy, safetensors and tqdm only.)
"""

from __future__ import annotations

from bertkit.settings.data import (
    CreateDataSettings,
    DownloadSettings,
    TokenizerSettings,
)
from bertkit.settings.fields import (
    LR_SCHEDULES,
    PAPER_GRID,
    checkpoint_fields,
    default_lr,
    parse_lr_grid,
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
    "LR_SCHEDULES",
    "NerSettings",
    "PAPER_GRID",
    "PredictBenchmarkSettings",
    "PredictFileSettings",
    "PredictGlueSettings",
    "PredictNerSettings",
    "PredictSquadSettings",
    "PredictSwagSettings",
    "QuantizeSettings",
    "PretrainSettings",
    "STUDY_COMBINATIONS",
    "SequenceClassificationSettings",
    "ServeSettings",
    "SquadSettings",
    "StudySettings",
    "SwagSettings",
    "TokenizerSettings",
    "TrainingSettings",
    "checkpoint_fields",
    "default_lr",
    "first",
    "parse_lr_grid",
    "resume_fingerprint",
]
