"""Helpers for the GRPO course notebooks: one module per concern; importing the package does no work.

    from helpers.profiles import get_profile
    from helpers.models import load_model
"""

__version__ = "0.2.0"
