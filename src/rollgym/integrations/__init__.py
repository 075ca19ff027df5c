"""Bridges from rollgym's rollouts to trainers: one token path (``samples``) and one module per
trainer. Each trainer module imports its trainer's package only when used."""
