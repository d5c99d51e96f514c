"""Repository tooling, not installed with fairclip: ``python -m tools.results ...``."""
