"""Private and public records: reading files and built-in sets, splitting, record sets."""
