"""What every layer uses: the exception family, atomic files, progress lines, signals and the fault hooks,
the environment of child processes. Imports nothing else of backendgen."""
