"""Deprecated location of :mod:`hwplug.model_zoo.kernel_binding` (moved out of the layers
package so that quant methods, which the layers import, need not import the layers)."""

import warnings

from hwplug.model_zoo.kernel_binding import bind, kernels_of, plan_and_dtype

warnings.warn("hwplug.model_zoo.layers.binding is deprecated; import bind, kernels_of and "
              "plan_and_dtype from hwplug.model_zoo.kernel_binding", DeprecationWarning,
              stacklevel=2)

__all__ = ["bind", "kernels_of", "plan_and_dtype"]
