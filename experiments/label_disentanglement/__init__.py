"""The label_disentanglement study (README.md beside this file)."""
