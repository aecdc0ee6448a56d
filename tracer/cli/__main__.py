"""``python -m tracer.cli``: the same command as the ``whyrestart`` script."""

from tracer.cli import main

main()
