"""Decoding backends: what runs a decoder step (placeholder docstring, rewritten below)."""
