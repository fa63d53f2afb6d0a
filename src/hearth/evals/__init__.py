"""hearth.evals."""
