"""Helper processes that must not outlive the process that started them."""
import ctypes
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time

PR_SET_PDEATHSIG = 1
PARENT_POLL_S = 0.2


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


def exit_with_parent(parent_pid: int, cleanup=None) -> threading.Thread:
    """A thread that ends this process (os._exit) within a moment of its parent's death, however the parent died
    (SIGKILL included), after cleanup() (removing what the parent can no longer remove). It waits on the pipe
    multiprocessing keeps to a spawned child's parent, whose end closes when the parent dies; other children poll
    their parent id. The main thread may be deep in a step meanwhile: this does not wait for it."""
    def watch():
        parent = multiprocessing.parent_process()
        while True:
            if parent is not None:
                multiprocessing.connection.wait([parent.sentinel])
            else:
                time.sleep(PARENT_POLL_S)
            if os.getppid() != parent_pid:
                break
        try:
            if cleanup is not None:
                cleanup()
        finally:
            os._exit(1)
    thread = threading.Thread(target=watch, name="atomlite-parent-watch", daemon=True)
    thread.start()
    return thread
