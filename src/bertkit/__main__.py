"""``python -m bertkit``: the same command line as ``bertkit`` (and what torchrun launches with ``-m bertkit``)."""

import sys

from bertkit.cli import main

sys.exit(main())
