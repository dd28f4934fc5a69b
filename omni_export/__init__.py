"""omni-export: export, lower, score and gate on-device speech and language models."""
__version__ = "0.1.0"
