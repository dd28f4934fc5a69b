"""Subcommands that live outside cli.py; each module has a register(group) function."""
