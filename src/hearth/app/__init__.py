"""hearth.app."""
