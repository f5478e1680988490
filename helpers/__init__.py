"""Helpers for the GRPO course notebooks: one module per concern; importing the package does no work."""

__version__ = "0.2.0"
