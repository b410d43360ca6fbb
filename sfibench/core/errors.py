"""The two ways a command ends early on purpose: input the user can fix, and the user stopping it.

Everything else that goes wrong is a bug or an environment failure and keeps its traceback, so the
CLI catches only these (and the few older, equally specific error classes other modules raise).
"""

from __future__ import annotations


class UsageError(ValueError):
    """Input a user can fix. The message names the option and the fix; the CLI prints it and exits 2.

    A ValueError, so callers that already guard a parse with `except ValueError` keep working.
    """


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C, after the command saved what it had: the message says what was kept and how to continue.

    A KeyboardInterrupt, so it unwinds like one and nothing on the way mistakes it for a failure.
    """


class ModelFileError(UsageError):
    """A model file (GGUF, checkpoint config, weights, tokenizer) that cannot be read as one.

    The message names the file, what is wrong with it and the fix; the loader raises it in place of
    whatever the reading library raised, so a damaged download is one line, not a traceback.
    """


class NonFiniteOutputError(UsageError):
    """The model's outputs (its logits) are not finite numbers: NaN or infinite weights in the checkpoint, or
    activations that overflow the dtype. No text chosen from them means anything, so the command stops; the
    message names the model and the fix."""


class WriteError(OSError):
    """A file sfibench writes (results.json, a report, a plot) that the system refused, whatever the reason
    (permissions, a full disk, a size limit): the CLI says what was kept and how to continue instead of a
    traceback. An OSError, with the errno, message and file name of the failure it stands for."""
