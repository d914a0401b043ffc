"""The command line: the typer app (`app`) and its shared options (`options`), what each command shows
(`render`, `progress`) and the one stream it prints through (`output`), its reference page (`clidoc`).

The top layer: it parses arguments, calls `backendgen.api` and shows the outcome; nothing below imports it."""
