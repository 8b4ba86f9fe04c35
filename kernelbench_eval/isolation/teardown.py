"""Leaving a process that holds torch without tearing its operator libraries down one by one.

Here because every process the harness runs pays for it at exit: the fork server skips them once for every worker
forked from it (`forkserver`), and the harness itself before it leaves (`cli.entry.leave`).
"""

from __future__ import annotations

import weakref


def skip_library_finalizers() -> int:
    """Keep torch's operator libraries (one `weakref.finalize` each, run at exit) from being torn down one by one
    at this process's exit: a tenth of a second or more, spent deregistering operators in a process that is
    ending, at every worker's exit and the harness's. Other finalizers (a candidate's, temp folders) still
    run. Returns how many were skipped."""
    skipped = 0
    for finalizer in list(getattr(weakref.finalize, "_registry", {})):
        info = finalizer.peek()
        func = info[1] if info else None
        if getattr(func, "__module__", "") == "torch.library" and getattr(func, "__name__", "") == "_del_library":
            finalizer.atexit = False
            skipped += 1
    return skipped
