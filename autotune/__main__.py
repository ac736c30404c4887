"""``python -m autotune``: the same as the ``autotune`` command."""

import sys

from autotune.cli import main

sys.exit(main())
