"""The calibration study (README.md beside this file)."""
