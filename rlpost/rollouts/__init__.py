"""Rollout allocation with static shapes: plain, DAPO dynamic sampling, DARS (allocate.py) and
the DARS schedule (dars.py)."""
