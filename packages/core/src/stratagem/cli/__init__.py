"""The ``stratagem`` command.

How a subcommand is written (``demo`` and ``consolidate`` follow it too):

- One module per subcommand, ``stratagem/cli/<name>.py``, exposing exactly two functions::

      def add_arguments(parser: argparse.ArgumentParser) -> None: ...
      def run(args: argparse.Namespace) -> int: ...

  ``add_arguments`` declares the subcommand's options on the parser ``main`` made for it;
  ``run`` does the work and returns the exit status (0 for success).
- The subcommand is listed in :data:`stratagem.cli.main.SUBCOMMANDS` with its module path and
  its one-line help. ``main`` imports a subcommand's module only when that subcommand runs,
  so ``stratagem --help`` and every other subcommand stay fast: keep heavy imports (torch,
  a backend) inside ``run`` or in modules that ``run`` imports.
- Output is for people on stdout; problems go to stderr. A subcommand that lists things
  offers ``--json`` for machines.
- Errors about what the user typed are raised as ``ValueError``/``TypeError`` or reported
  through ``parser.error``; ``main`` prints them as ``stratagem <name>: error: ...`` and
  returns 2, without a traceback.
"""
