"""Benchmark harness: our XMC stages vs libpecos, napkinXC and omikuji (see README.md)."""
