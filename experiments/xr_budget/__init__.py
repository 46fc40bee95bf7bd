"""The xr_budget study (README.md beside this file)."""
