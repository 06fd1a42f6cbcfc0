"""Finding and loading platforms and plugins through entry points.

On first :func:`current_platform` hwplug (1) asks every ``hwplug.platforms`` entry point
what its probe sees and ranks the active candidates, or takes the one ``HWPLUG_PLATFORM``
forces (:mod:`.ranking`); (2) imports the ``hwplug.plugins`` entry points, checks their
API range, orders them and calls their hooks through pluggy, one plugin at a time
(:mod:`.plugins`); (3) keeps the result for the process (:mod:`.state`). A plugin that
fails is skipped, its registrations dropped and its traceback kept for ``hwplug info``;
``HWPLUG_STRICT_PLUGINS=1`` makes that an error.
"""

from hwplug.discovery.entry_points import (
    API_VERSION,
    BUILTIN_PLATFORM,
    HWPLUG_DISTRIBUTION,
    MODEL_GROUP,
    PLATFORM_GROUP,
    PLUGIN_GROUP,
    entry_points,
)
from hwplug.discovery.plugins import PluginHost, PluginRecord
from hwplug.discovery.ranking import Candidate
from hwplug.discovery.state import Resolution, current_platform, discover, reset, resolution

__all__ = ["API_VERSION", "BUILTIN_PLATFORM", "HWPLUG_DISTRIBUTION", "MODEL_GROUP",
           "PLATFORM_GROUP", "PLUGIN_GROUP", "Candidate", "PluginHost", "PluginRecord",
           "Resolution", "current_platform", "discover", "entry_points", "reset",
           "resolution"]
