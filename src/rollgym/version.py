"""rollgym's version, in a module of its own: every part may read it, and ``rollgym`` itself
(whose names import the trainer API) is imported by none of them."""

__version__ = "0.1.0"
