"""
The report of a run: Markdown tables, ratios, targets, charts, and the files they go to.

:mod:`.render` assembles report.md from the sections (one module each), :mod:`.files` writes
report.md, results.json and the charts of a run or of ``--render DIR``, and :mod:`.headline` picks
the figures printed last.  The statistics helpers are :mod:`benchmarks.stats`, which measuring
code uses too.
"""
