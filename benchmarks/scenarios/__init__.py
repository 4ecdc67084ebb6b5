"""
The scenarios: one module per thing the suite measures, each declaring itself with a Scenario record.

:mod:`.catalog` lists them in the order a run takes them.  Helper modules start with an underscore.
"""
