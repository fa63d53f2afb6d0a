"""hearth.gateway."""
