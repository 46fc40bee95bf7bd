"""The precision study (README.md beside this file)."""
