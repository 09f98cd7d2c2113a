"""What a recipe process that fails for a known reason tells its launcher.

- ``failure_record``: the record's format, written and read here alone: its kind, the
  user's one line and the exit code, one file per rank in a directory the launcher makes
  fresh for each run. The recipe process decides what to write
  (``recipe_process.failure_report``); the launcher reports the lowest rank's
  (``launcher.outcome``). Below both: it imports nothing of the trainer's.
"""
