"""`python -m frtrace` runs the command-line tool."""

from frtrace.cli.analyse import main

main()
