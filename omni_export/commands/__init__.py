"""Subcommands that live outside cli.py (reports, verify, ...), and the click group's error handling."""
