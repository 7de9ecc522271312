"""`python -m probe ...` is `trainfit-probe ...`."""

from probe.cli import console_main

console_main()
