"""Verifiable tasks: synthetic arithmetic and Countdown (tfds builders), and GSM8K / MATH loaders."""
