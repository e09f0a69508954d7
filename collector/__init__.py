"""The collector: OTLP receiver, trace join, decomposition, reports."""
