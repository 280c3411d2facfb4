"""Triton's interpreter (3.7 to 3.9) patches triton.language into its interpreted form at every call of a
@triton.jit helper inside a kernel (InterpretedFunction.__call__ runs _patch_lang again), about a millisecond each,
though the launch around it has patched the same modules; a kernel calling helpers in a loop spent most of its time
there. Here a helper whose modules are patched already is called as it is; a launch still patches (and restores)
as before. What the kernels compute is unchanged: the same interpreted operations run, only the repeated patching
is skipped. Installed by conftest.py under TRITON_INTERPRET=1."""
import inspect


def install() -> bool:
    """Patch the interpreter (False, changing nothing, where it lacks what this wraps)."""
    import triton.language as tl
    from triton.runtime import interpreter
    if not all(hasattr(interpreter, name) for name in ("InterpretedFunction", "InterpreterError", "_patch_lang")):
        return False
    helper_call = interpreter.InterpretedFunction.__call__
    unpatched_load = {id(tl): tl.load, id(tl.core): tl.core.load}  # each module's own, before any launch

    def patched(fn) -> bool:
        languages = [v for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)]
        return bool(languages) and all(lang.load is not unpatched_load[id(lang)] for lang in languages)

    def call_without_repatching(self, *args, **kwargs):
        if not patched(self.fn):
            return helper_call(self, *args, **kwargs)
        fn = self.rewrite()  # what helper_call does after its _patch_lang
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            raise interpreter.InterpreterError(repr(e)) from e

    interpreter.InterpretedFunction.__call__ = call_without_repatching
    return True
