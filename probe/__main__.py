"""`python -m probe ...` is `trainfit-probe ...`."""

from probe.cli import main

raise SystemExit(main())
