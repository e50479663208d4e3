"""``python -m twostage``: the command line."""

import sys

from twostage.app.cli import main

sys.exit(main())
