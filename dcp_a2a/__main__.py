"""``python -m dcp_a2a validate ...`` is ``dcp-a2a validate ...`` (the harness's command line;
an entry point only: the product itself never imports the harness)."""

import sys

from .testing.cli import main

sys.exit(main())
