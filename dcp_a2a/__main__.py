"""``python -m dcp_a2a validate ...`` is ``dcp-a2a validate ...``."""

import sys

from .cli import main

sys.exit(main())
