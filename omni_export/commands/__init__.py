"""Subcommands beside the per-recipe ones (verify), and the click group's error handling."""
