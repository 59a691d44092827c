"""``python -m shoal ...``: the ``shoal`` command, for an environment whose scripts are not on PATH."""

import sys

from shoal.cli import main

sys.exit(main())
