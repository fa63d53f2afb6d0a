"""The package exposes each op as a function under its torch.nn.functional-style name, even after
the op's module has been imported directly (which binds the submodule onto the package)."""

import importlib

import hearth.kernels as K


def test_every_public_name_is_a_function_after_submodule_import():
    for name in K.__all__:
        importlib.import_module(f"hearth.kernels.{name}")
        assert callable(getattr(K, name)), f"hearth.kernels.{name} is {type(getattr(K, name)).__name__}, not a function"
