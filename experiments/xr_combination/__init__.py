"""The xr_combination study (README.md beside this file)."""
