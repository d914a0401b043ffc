"""Programs backendgen runs in a child Python, as `python -m backendgen.programs.NAME`: each
imports only what it needs (torch, mostly), never the rest of backendgen."""
