"""hearth.train."""
