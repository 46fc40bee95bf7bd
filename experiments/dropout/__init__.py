"""The dropout study (README.md beside this file)."""
