"""`python -m nicop` runs the `nicop` command."""

from nicop.cli import main

main()
