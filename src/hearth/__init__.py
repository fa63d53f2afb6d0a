"""hearth: train and serve your own companion model on a budget.

Subpackages are imported lazily: `import hearth` pulls in neither torch nor the web stack.
"""

__version__ = "0.1.0"
