"""``python -m hwplug`` is the ``hwplug`` command."""

import sys

from hwplug.cli.main import main

sys.exit(main())
