"""`python -m mocker` runs the command-line interface."""

from mocker.cli import main

raise SystemExit(main())
