"""hwplug hooks of hwplug-xpu."""

from __future__ import annotations

import importlib.util
import logging

from hwplug import hookimpl
from hwplug.platform_interface import Platform

logger = logging.getLogger(__name__)

hwplug_api_version = ">=1,<2"


@hookimpl
def hwplug_platform_resolved(platform: Platform) -> None:
    """Say where intel-extension-for-pytorch would help and is missing."""
    if platform.name == "xpu" and importlib.util.find_spec("intel_extension_for_pytorch") is None:
        logger.info("intel-extension-for-pytorch is not installed (optional: "
                    "pip install \"hwplug-xpu[ipex]\"); hwplug-xpu has no kernels of its own yet")
