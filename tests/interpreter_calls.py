"""Triton's interpreter (3.7 to 3.9) patches triton.language into its interpreted form at every call of a
@triton.jit helper inside a kernel (InterpretedFunction.__call__ runs _patch_lang again), about a millisecond each,
though the launch around it has patched the same modules; a kernel calling helpers in a loop spent most of its time
there. A helper whose modules are patched already is called as it is. What the kernels compute is unchanged: the
same interpreted operations run, only the repeated patching is skipped. Installed by conftest.py under
TRITON_INTERPRET=1."""
import inspect


class _Unchanged:
    """The patch scope of a call that patched nothing: nothing to restore."""

    def restore(self) -> None:
        pass


def install() -> bool:
    """Patch the interpreter (False, changing nothing, where it lacks the function this wraps)."""
    import triton.language as tl
    from triton.runtime import interpreter
    if not hasattr(interpreter, "_patch_lang"):
        return False
    patch_lang = interpreter._patch_lang
    unpatched_load = {id(tl): tl.load, id(tl.core): tl.core.load}  # each module's own, before any launch

    def patch_unless_patched(fn):
        languages = [v for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)]
        if languages and all(lang.load is not unpatched_load[id(lang)] for lang in languages):
            return _Unchanged()  # a launch in progress patched them: its scope restores them when it ends
        return patch_lang(fn)

    interpreter._patch_lang = patch_unless_patched
    return True
