"""
The report of a run: Markdown tables, ratios, targets, charts, and the files they go to.

:mod:`.render` assembles report.md from the sections (one module each), :mod:`.files` writes
report.md, results.json and the charts of a run or of ``--render DIR``, :mod:`.headline` picks the
figures printed last, and :mod:`.stats` holds the statistics helpers every part uses.  This
package's ``__init__`` imports nothing, so that measuring code can use :mod:`.stats` alone.
"""
