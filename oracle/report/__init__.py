"""Telling: the stage table, the closing sentence and the JSON (table, schema.json), and the plots.
Prints numbers `oracle.judging` made; computes none. May import `oracle.judging` and below."""
