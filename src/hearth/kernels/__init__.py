"""hearth's Triton kernels, named like torch.nn.functional (one file per op).

The public functions are imported eagerly: a lazy module __getattr__ would be shadowed by the
submodule of the same name as soon as anything imported `hearth.kernels.<op>` (Python binds the
submodule onto the package), and `hearth.kernels.softmax` would silently become a module.
Importing defines the @triton.jit functions but compiles nothing.
"""

from hearth.kernels.attention import attention
from hearth.kernels.attention_varlen import attention_varlen
from hearth.kernels.cross_entropy import cross_entropy
from hearth.kernels.layer_norm import layer_norm
from hearth.kernels.linear_cross_entropy import linear_cross_entropy
from hearth.kernels.matmul import matmul
from hearth.kernels.rms_norm import rms_norm
from hearth.kernels.rope import rope
from hearth.kernels.softmax import softmax
from hearth.kernels.swiglu import swiglu

__all__ = [
    "softmax",
    "cross_entropy",
    "linear_cross_entropy",
    "rms_norm",
    "layer_norm",
    "rope",
    "swiglu",
    "attention",
    "attention_varlen",
    "matmul",
]
