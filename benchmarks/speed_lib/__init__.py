"""The speed benchmark (`benchmarks/speed.py`), a module a job: `models` (shapes, tokenizer, inputs, device helpers),
`arms` (the step of each arm), `groups` (the processes the arms run in, and their measurements: time, peak memory
through `counting`, host syncs), `report` (the JSON and the tables)."""
