"""The errors a user can fix, as opposed to bugs.

The command line (:mod:`dllm_rl.cli`) prints an exception of a type in :data:`USER_ERRORS` as one line
``dllm-rl COMMAND: error: MESSAGE`` and exits with status 2 (argparse's status for a bad command line);
any other exception is a bug and keeps its traceback. So a message raised as a :class:`UserError` must
stand alone: it names the file, key or line that is wrong and says what to do.
"""

from __future__ import annotations


class UserError(ValueError):
    """A bad input the user can fix: a config value, a data file, a checkpoint directory.

    A ``ValueError`` subclass, so code that catches ``ValueError`` keeps working."""


#: what the CLI reports as one line without a traceback (exit status 2)
USER_ERRORS: tuple[type[BaseException], ...] = (
    UserError, FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError,
)
