"""The xmc_base study (README.md beside this file)."""
