"""The label_growth study (README.md beside this file)."""
