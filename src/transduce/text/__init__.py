"""The text around translation (placeholder docstring, rewritten below)."""
