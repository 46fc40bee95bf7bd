"""The xrlinear_settings study (README.md beside this file)."""
