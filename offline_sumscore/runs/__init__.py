"""Whole runs over many rows: a file or folder (files), in checkpointed chunks that never lose a row (bulk), on a
pool of Ray actors (ray_pool), or a pandas DataFrame (frame). The CLI and the Python API call the same functions.
May import every layer below it."""
