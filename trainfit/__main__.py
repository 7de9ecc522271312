"""`python -m trainfit` = the `trainfit` command."""

import sys

from trainfit.cli import main

sys.exit(main())
