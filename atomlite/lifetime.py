"""Helper processes that must not outlive the process that started them."""
import ctypes
import os
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """This process gets SIGKILL when its parent (parent_pid) dies (Linux; the parent thread that started it, in
    fact): a helper blocked on a pipe or a GPU would otherwise never notice. Exits at once if the parent is gone
    already."""
    try:
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        return  # not Linux: the caller's own check of its parent is what remains
    if os.getppid() != parent_pid:
        os._exit(1)
