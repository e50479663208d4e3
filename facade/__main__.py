"""``python -m twostage``: the command line."""

from twostage.app.cli import run

run()
