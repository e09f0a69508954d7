"""``deltatap compare RUN_A RUN_B [RUN_C ...]``: run against run, per component delta and percentile, with
bootstrap confidence intervals, a significance test and regressions flagged against a threshold.

* :mod:`.stats`: the seeded, numpy-vectorised percentile bootstrap of a difference and the Mann-Whitney U test;
* :mod:`.build`: loading the runs (rows files, collector and bench output directories) and the comparison;
* :mod:`.render`: terminal, Markdown, JSON and a self-contained HTML page with plots;
* :mod:`.cli`: the subcommand. User guide: docs/compare.md.
"""
