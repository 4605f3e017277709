"""A kernel's broken hardware rule, named with the kernel's own source line.

Every check of the kernel language raises KernelError through fail(): the
message names the kernel, the file and line of the kernel's statement that
broke the rule (the innermost frame outside the language's own modules), the
statement's text and what was wrong::

    nki kernel add_kernel, kernels.py:14: tile of 256 partitions: the
    partition dimension (the first) holds at most 128
        a = nl.load(a_hbm[0:256, :])
"""

import linecache
import os
import sys

from .._C import InvalidUsageError

# The language's own modules: frames in them are never the user's line.
_OWN = {os.path.join(os.path.dirname(os.path.abspath(__file__)), name)
        for name in ("errors.py", "tiles.py", "schedule.py", "language.py", "isa.py",
                     "kernel.py")}


class KernelError(InvalidUsageError):
    """A kernel broke a rule of the hardware (or of the language): raised
    while the kernel runs, naming its source line. ``line`` is
    (filename, lineno) of that statement."""

    def __init__(self, message, line=None):
        super().__init__(message)
        self.line = line


def user_line():
    """(filename, lineno) of the innermost frame outside the language's
    modules: the kernel statement being run."""
    frame = sys._getframe(1)
    while frame is not None and os.path.abspath(frame.f_code.co_filename) in _OWN:
        frame = frame.f_back
    if frame is None:
        return ("<unknown>", 0)
    return (frame.f_code.co_filename, frame.f_lineno)


def fail(message, kernel_name=None):
    """Raises KernelError for `message` at the kernel's current line."""
    from . import kernel as _kernel  # the running kernel, if any
    name = kernel_name or _kernel.current_name()
    filename, lineno = user_line()
    text = linecache.getline(filename, lineno).strip()
    where = f"{os.path.basename(filename)}:{lineno}"
    raise KernelError(f"nki kernel {name}, {where}: {message}\n    {text}",
                      line=(filename, lineno))
