"""hearth.bench."""
