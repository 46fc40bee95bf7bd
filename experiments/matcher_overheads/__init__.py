"""The matcher_overheads study (README.md beside this file)."""
