"""The seed_ensemble study (README.md beside this file)."""
