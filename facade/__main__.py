"""``python -m twostage``: the command line."""

import sys

from twostage.eval.cli import main

sys.exit(main())
