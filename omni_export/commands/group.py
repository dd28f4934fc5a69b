"""The top-level click group: every usage error is one line, `omni-export: error: ...`, exit 2."""
from __future__ import annotations

import sys

import click


class OneLineErrors(click.Group):
    """click prints usage errors as a usage block; ours are one line naming the cause and the fix."""

    def resolve_command(self, ctx, args):
        name = args[0] if args else ""
        if name and not name.startswith("-") and self.get_command(ctx, name) is None:
            from ..recipes import REGISTRY

            others = sorted(set(self.commands) - set(REGISTRY))
            raise click.UsageError(f"unknown recipe '{name}'; valid: {', '.join(REGISTRY)} "
                                   f"(other commands: {', '.join(others)})")
        return super().resolve_command(ctx, args)

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.exceptions.Abort:
            click.echo("omni-export: error: interrupted", err=True)
            sys.exit(130)
        except click.ClickException as e:
            click.echo(f"omni-export: error: {e.format_message()}", err=True)
            sys.exit(e.exit_code)
        sys.exit(code if isinstance(code, int) else 0)
