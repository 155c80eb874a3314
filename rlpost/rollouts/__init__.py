"""Rollout allocation with static shapes: DARS schedules and merged groups."""
