"""Command-line helpers shared by the scripts under ``tools/`` (standard library only).

* :func:`checkpoint_io_parser`: the parser of a tool that reads one checkpoint and writes
  another (two positional paths, optionally ``--trust-checkpoint``);
* :func:`add_trust_checkpoint_argument`: the ``--trust-checkpoint`` flag, worded once for every
  tool that may unpickle a checkpoint;
* :func:`load_script`: another tool script imported as a module (``tools/`` is not a package).
"""
import argparse
import importlib.util
from types import ModuleType
from typing import Optional, Tuple

#: (argument name, help) of a positional path.
PathArgument = Tuple[str, str]


def add_trust_checkpoint_argument(parser: argparse.ArgumentParser,
                                  what: str = 'a file that holds Python objects') -> None:
    """Adds ``--trust-checkpoint`` (``args.trust_checkpoint``) to ``parser``.

    Args:
        parser: The tool's parser.
        what: The file the flag lets the tool unpickle in full, for the help text.
    """
    parser.add_argument('--trust-checkpoint', action='store_true',
                        help=f'allow a full unpickle of {what} (runs code from the file: only '
                        'for trusted files)')


def checkpoint_io_parser(description: str, source: PathArgument, destination: PathArgument,
                         trust: Optional[str] = None) -> argparse.ArgumentParser:
    """A parser with the positional source and destination paths of a checkpoint tool.

    Args:
        description: The tool's one-line description.
        source: (name, help) of the checkpoint read, e.g. ``('src', 'source checkpoint')``.
        destination: (name, help) of the file written.
        trust: When given, ``--trust-checkpoint`` is added with this as the ``what`` of
            :func:`add_trust_checkpoint_argument`; tools that place the flag elsewhere add it
            themselves.

    Returns:
        The parser; the tool adds its own options.
    """
    parser = argparse.ArgumentParser(description=description)
    for name, help_text in (source, destination):
        parser.add_argument(name, help=help_text)
    if trust is not None:
        add_trust_checkpoint_argument(parser, trust)
    return parser


def load_script(path: str, module_name: str) -> ModuleType:
    """Imports the Python file ``path`` as a module named ``module_name`` (not cached in
    ``sys.modules``).

    Raises:
        ImportError: ``path`` is not an importable Python file.
    """
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f'{path} cannot be imported as a Python module (not a .py file?)')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
