"""Qualcomm AI Hub: compile, profile and run accepted builds on real phones; gate the phone's outputs.

client.py   the only module that imports qai_hub (credentials, errors, redaction, test seam)
routes.py   per build: what is uploaded, which runtime and options (pure, from the manifest)
records.py  the jobs recorded in manifest.json itself (rewritten atomically after every change)
jobs.py     one build's jobs as a resumable state machine (upload -> quantize? -> compile -> inference)
device.py   device outputs scored with the same metrics and gate as local builds
profile.py  AI Hub profile dicts -> per-graph time, memory, compute-unit split
rtf.py      per-frame figures and the real-time-factor estimate for the target's placement
stage.py    `hub submit` / `--hub` on an output directory, end to end
"""
