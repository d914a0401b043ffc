"""The command line: the typer app (`app`), its reference page (`clidoc`) and what it prints (`output`).

The top layer: it parses arguments, calls `backendgen.api` and shows the outcome; nothing below imports it."""
