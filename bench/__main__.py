"""``python -m bench``: what scripts/bench runs."""

import sys

from bench.cli import run

sys.exit(run())
