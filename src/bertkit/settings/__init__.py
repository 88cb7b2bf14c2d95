"""Every command's settings, each field declared once: its flag, config-file key and help (its attribute docstring)
come from it (``bertkit.cli_flags``), and ``bertkit.TrainingArguments`` from ``training.TrainingSettings``.

``fields`` holds the field helper ``flag``, the checks and the field groups several commands share; ``training``,
``finetune``, ``inference`` and ``data`` the commands' settings. Nothing here imports torch: ``bertkit --help`` stays fast.
(jsonargparse or tyro would generate the flags too, but the core depends on torch, numpy, safetensors and tqdm only.)
Public names are imported lazily (PEP 562), as ``bertkit``'s own.
"""

from __future__ import annotations

from bertkit import _lazy_getattr

_MODULES = {
    "data": ("CreateDataSettings", "DownloadSettings", "TokenizerSettings"),
    "fields": ("LR_SCHEDULES", "PAPER_GRID", "checkpoint_fields", "default_lr", "fingerprint_defaults", "parse_lr_grid",
               "resume_fingerprint"),
    "inference": ("ConvertTfSettings", "ExportOnnxSettings", "ExtractSettings", "PredictBenchmarkSettings",
                  "PredictFileSettings", "PredictGlueSettings", "PredictNerSettings", "PredictSquadSettings",
                  "PredictSwagSettings", "QuantizeSettings", "ServeSettings"),
    "training": ("STUDY_COMBINATIONS", "DemoSettings", "PretrainSettings", "StudySettings", "TrainingSettings",
                 "first"),
    "finetune": ("ClassifySettings", "FinetuneSettings", "GlueSettings", "NerSettings",
                 "SequenceClassificationSettings", "SquadSettings", "SwagSettings"),
}
_EXPORTS = {name: f"bertkit.settings.{module}" for module, names in _MODULES.items() for name in names}
__all__ = list(_EXPORTS)

__getattr__ = _lazy_getattr("bertkit.settings", _EXPORTS)
