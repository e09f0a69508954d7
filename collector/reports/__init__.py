"""deltatap's reports: pure functions from decomposition rows (and the topology) to a document of
sections, tables, notes and figures, rendered to the terminal, Markdown, CSV, JSON and one
self-contained HTML page. See docs/reports.md."""
