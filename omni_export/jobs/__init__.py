"""The build as a job graph: plan, schedule, run on workers, record (see graph.py)."""
