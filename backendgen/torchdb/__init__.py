"""What the installed torch says: its operators, schemas and C++ signatures (`opdb`), how a recorded
operator stands in it (`drift`), and whether backendgen supports it (`support`)."""
