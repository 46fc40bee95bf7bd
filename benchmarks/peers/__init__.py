"""Peer libraries as benchmark systems: one module each, run by the python of its own virtual
environment as ``python -m benchmarks.peers.<name>_runner`` from the repository root (``systems.py``)."""
