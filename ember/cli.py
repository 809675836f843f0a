"""The `ember` command line: one click group, one module per subcommand under ember/commands."""

from __future__ import annotations

import importlib
import sys
import warnings

import click

from ember.errors import user_error_types, user_warning_types
from ember.files import guard
from profiler.session import set_log_severity

# (module under ember.commands, attribute): each attribute is a click command or group.
COMMANDS = [
    ("show", "show"),
    ("run", "run"),
    ("demo", "demo"),
    ("accuracy", "accuracy"),
    ("examples", "examples"),
    ("profile", "quantize_profile"),
    ("profile", "profile"),
    ("round_weights", "round_weights_"),
    ("disasm", "disasm"),
    ("simulate", "simulate"),
    ("report", "report"),
    ("compile", "compile_"),
    ("sweep", "sweep"),
]


class _Group(click.Group):
    """Turns user errors into one line on stderr and exit code 2; tracebacks only with --debug."""

    def invoke(self, ctx: click.Context):
        try:
            return super().invoke(ctx)
        except user_error_types() as err:
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"ember: error: {err}", err=True)
            sys.exit(2)
        except KeyboardInterrupt:
            click.echo("ember: interrupted", err=True)
            sys.exit(130)
        except (click.exceptions.Exit, click.ClickException, click.Abort):
            raise
        except Exception as err:  # a bug in ember, not the user's fault: exit 1
            if ctx.obj and ctx.obj.get("debug"):
                raise
            click.echo(f"ember: internal error: {type(err).__name__}: {err} (rerun with --debug)",
                       err=True)
            sys.exit(1)


EXIT_CODES = ("Exit codes: 0 success, 1 internal error, 2 bad usage or input, 3 an accuracy gate "
              "failed (the report is still written), 130 interrupted (Ctrl-C).")


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]},
             epilog=EXIT_CODES)
@click.option("--debug", is_flag=True, help="Show full tracebacks instead of one-line errors.")
@click.version_option(package_name="ember")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """ember: an fp32 ONNX model in, a bit-exact int8 program for an accelerator out.

    \b
    The flow:
      ember quantize-profile model.onnx --data calib.npz -o model.profile.json
      ember round-weights model.onnx --profile model.profile.json --data calib.npz  (optional)
      ember compile model.onnx --int8 --profile model.profile.json -o model.ember
      ember simulate model.ember -i input.npz --report perf.json --trace trace.json
      ember report model.ember -i input.npz --html perf.html
      ember accuracy model.onnx model.ember --profile model.profile.json --data eval.npz
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    # onnxruntime logs its own errors in red on stderr, even those ember expects and handles
    # (the profiler's batch probe of a model fixed to batch 1): only its fatal ones, unless
    # --debug asks for its warnings and errors too (severities: 2 warning, 3 error, 4 fatal).
    set_log_severity(2 if debug else 4)
    warnings.showwarning = _show_warning


_default_showwarning = warnings.showwarning


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """ember's own warnings as one line on stderr, like its errors; others as Python shows them."""
    if issubclass(category, user_warning_types()):
        click.echo(f"ember: warning: {message}", err=True)
    else:
        _default_showwarning(message, category, filename, lineno, file, line)


for _module, _attr in COMMANDS:
    cli.add_command(guard(getattr(importlib.import_module(f"ember.commands.{_module}"), _attr)))


def main() -> None:
    cli(prog_name="ember")
