"""The cnn_baselines study (README.md beside this file)."""
