"""freeze_startup_heap: what a server process made while starting is left out of later collections."""
import subprocess
import sys

CHILD = """
import gc
from atomlite.heap import freeze_startup_heap
made_at_startup = [[i] for i in range(10000)]  # lists: always tracked by the collector
freeze_startup_heap()
made_later = [[i] for i in range(10)]
walked = {id(o) for o in gc.get_objects()}
assert gc.get_freeze_count() >= len(made_at_startup), gc.get_freeze_count()
assert not any(id(o) in walked for o in made_at_startup)
assert all(id(o) in walked for o in made_later)
"""


def test_objects_made_before_the_freeze_are_no_longer_walked_and_later_ones_are():
    # its own process: a frozen heap is never collected again, which a test process must not inherit
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
