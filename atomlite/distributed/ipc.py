"""GPU memory that other processes map, through the runtime library torch has loaded (CUDA's cudart, or HIP's): torch
shares tensors across processes too, but maps a peer's memory on the peer's GPU, where this process's GPU cannot
read it. Memory opened here is mapped for the current GPU, with peer access enabled."""
import ctypes

import torch

IPC_HANDLE_BYTES = 64
LAZY_ENABLE_PEER_ACCESS = 1  # cudaIpcMemLazyEnablePeerAccess / hipIpcMemLazyEnablePeerAccess


class IpcHandle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_char * IPC_HANDLE_BYTES)]


def loaded_library(name: str) -> str:
    """The path of the shared library `name` (libcudart, libamdhip64) this process has loaded."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1]
            if f"/{name}" in path and ".so" in path:
                return path
    raise RuntimeError(f"{name} is not loaded in this process (torch on a GPU loads it)")


class Runtime:
    """The runtime library's calls on one GPU: it is made current in the library itself, which need not be the
    copy whose current device torch set."""

    def __init__(self, device: torch.device):
        torch.cuda.init()
        name, self.prefix = ("libamdhip64", "hip") if torch.version.hip else ("libcudart", "cuda")
        self.lib = ctypes.CDLL(loaded_library(name))
        index = device.index if device.index is not None else torch.cuda.current_device()
        self._call("SetDevice", ctypes.c_int(index))

    def _call(self, function: str, *args) -> None:
        error = getattr(self.lib, self.prefix + function)(*args)
        if error != 0:
            raise RuntimeError(f"{self.prefix}{function} failed (error {error})")

    def malloc(self, nbytes: int) -> int:
        """nbytes on the current GPU, zeroed."""
        pointer = ctypes.c_void_p()
        self._call("Malloc", ctypes.byref(pointer), ctypes.c_size_t(nbytes))
        self._call("Memset", pointer, 0, ctypes.c_size_t(nbytes))
        self._call("DeviceSynchronize")
        return pointer.value

    def ipc_handle(self, pointer: int) -> bytes:
        """What another process opens to map the allocation that starts at pointer."""
        handle = IpcHandle()
        self._call("IpcGetMemHandle", ctypes.byref(handle), ctypes.c_void_p(pointer))
        return ctypes.string_at(ctypes.addressof(handle), IPC_HANDLE_BYTES)

    def open_ipc_handle(self, handle: bytes) -> int:
        """Another process's allocation, mapped for the current GPU."""
        pointer = ctypes.c_void_p()
        self._call("IpcOpenMemHandle", ctypes.byref(pointer), IpcHandle.from_buffer_copy(handle),
                   ctypes.c_uint(LAZY_ENABLE_PEER_ACCESS))
        return pointer.value
