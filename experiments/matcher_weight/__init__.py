"""The matcher_weight study (README.md beside this file)."""
