"""Post-mortem: why did it restart, asked after the fact, with no recording.

What the machine still knows is gathered (``gather``: the kernel log ring from its start, the
memory counters and limits of the target's cgroups and their ancestors now, the runtime's
record of the last exit and its restart count), turned into the project's own events on one
clock (``correlate``, pure), and judged by the same ``Analyzer`` that ``replay`` uses, built
from a header the same way: the same causes, confidence rules, evidence and advice.
``report`` (pure) says what was found, what a recording would have added, and the command
that records the next one. Where the always-on agent ran, its journal's verdicts about the
target are quoted beside (``gather.agent_journal``).
"""
