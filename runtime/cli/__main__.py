"""`python -m runtime.cli ...` runs the `jmamba` command."""

import sys

from runtime.cli import main

sys.exit(main())
