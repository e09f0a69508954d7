"""deltatap: where the time goes in an LLM serving stack."""

__version__ = "0.1.0"
