"""Helpers for the GRPO course notebooks.

One module per concern; importing this package does no work and loads no
heavy library. Import what you need, e.g.::

    from helpers.config import get_profile
    from helpers.models import load_model
"""

__version__ = "0.2.0"
