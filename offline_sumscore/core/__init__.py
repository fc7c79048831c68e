"""The floor everything stands on, and that imports nothing above it: what a stage asks and answers (stages,
schemas, prompts), the input rows (samples), the pure score arithmetic, the result records and the errors.

May import nothing of the package's: every other layer imports from here."""
