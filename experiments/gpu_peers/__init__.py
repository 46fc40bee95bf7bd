"""The gpu_peers study (README.md beside this file)."""
