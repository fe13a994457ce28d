"""`python -m frtrace` runs the command-line tool."""

from frtrace.cli import main

main()
