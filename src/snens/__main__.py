"""``python -m snens``: the ``snens`` command line, where the console script is not on PATH."""

import sys

from snens.engine.cli import main

sys.exit(main())
