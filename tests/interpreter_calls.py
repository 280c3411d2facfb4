"""Triton 3.7's interpreter patches triton.language into its interpreted form at every call of a @triton.jit helper
inside a kernel (InterpretedFunction.__call__ runs _patch_lang again), about a millisecond each, though the launch
around it patched the same modules already; a kernel calling helpers in a loop spent most of its time there. Within
one launch, a helper whose modules that launch has patched is called as it is. What the kernels compute is
unchanged: the same interpreted operations run, only the repeated patching is skipped. Installed by conftest.py
under TRITON_INTERPRET=1."""
import inspect
import threading

_launch = threading.local()  # .patched: ids of the language modules the launch in progress patched; None outside


class _Unchanged:
    """The patch scope of a call that patched nothing: nothing to restore."""

    def restore(self) -> None:
        pass


def install() -> bool:
    """Patch the interpreter (False, changing nothing, where it lacks the functions this wraps)."""
    import triton.language as tl
    from triton.runtime import interpreter
    if not (hasattr(interpreter, "_patch_lang") and hasattr(interpreter, "GridExecutor")):
        return False
    patch_lang, run_grid = interpreter._patch_lang, interpreter.GridExecutor.__call__

    def languages(fn) -> frozenset:
        return frozenset(id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core))

    def patch_once_per_launch(fn):
        patched, needed = getattr(_launch, "patched", None), languages(fn)
        if patched is not None and needed <= patched:
            return _Unchanged()
        scope = patch_lang(fn)
        if patched is not None:
            patched |= needed
        return scope

    def launch(self, *args, **kwargs):
        _launch.patched = set()
        try:
            return run_grid(self, *args, **kwargs)
        finally:
            _launch.patched = None

    interpreter._patch_lang = patch_once_per_launch
    interpreter.GridExecutor.__call__ = launch
    return True
