"""Progress bars: tqdm's, drawn where a call asks for one unless the environment turns bars off.

tqdm reads its ``TQDM_*`` environment variables (``TQDM_DISABLE=1``, which transformers' Trainer and datasets honour
too) only for the arguments its caller leaves out, so a bar is made with ``disable`` left out when it is wanted: the
user's variable then decides, by tqdm's own rule, as for transformers' bars.
"""

from __future__ import annotations

from typing import Any


def progress_bar(iterable: Any = None, *, enabled: bool, **kwargs: Any) -> Any:
    """``tqdm.auto.tqdm(iterable, **kwargs)``, disabled when not ``enabled`` or when the environment says so."""
    from tqdm.auto import tqdm  # (not at import: `bertkit --help` loads no tqdm)

    return tqdm(iterable, **kwargs) if enabled else tqdm(iterable, disable=True, **kwargs)
