"""``python -m dcp_a2a COMMAND ...`` is ``dcp-a2a COMMAND ...`` (the harness's command line), and
what torchrun starts per rank: ``torchrun --nproc-per-node N -m dcp_a2a accuracy ...``. An entry
point only: the product itself never imports the harness."""

import sys

from .testing.cli import main

sys.exit(main())
