"""`python -m frtrace` runs the command-line tool."""

from .cli import main

main()
