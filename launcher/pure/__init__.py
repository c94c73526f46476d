"""Pure judgement: no side effects (no files, processes, clock or network); imports only the core."""
