"""The start of a child script that runs harness._child with the CUDA driver emulated in host memory:
"device" memory is ctypes buffers (kept alive in MEM), copies are memmoves, the context is a stand-in.
A test appends what its kernels need (modules, launches, streams, events) and `_child.main(...)`."""

DRIVER_IN_HOST_MEMORY = r'''
import ctypes, os, struct, sys
from harness import _child, cuda_driver as cu

MEM = []

def alloc(n):
    buf = ctypes.create_string_buffer(max(int(n), 1))
    MEM.append(buf)
    return ctypes.addressof(buf)

def htod(dptr, src, nbytes=None):
    if isinstance(src, int):
        ctypes.memmove(dptr, src, nbytes)
    else:
        data = bytes(src)[: (len(src) if nbytes is None else nbytes)]
        ctypes.memmove(dptr, data, len(data))

class Context:
    def __init__(self, device): self.ordinal, self.name, self.compute_capability = device, "emulated", (9, 0)

def host_alloc(n):
    a = alloc(n)
    return cu.HostMapped(a, a, n, False)

cu.init = lambda: None
cu.call = lambda name, *a: 12080 if name == "cuDriverGetVersion" else None
cu.Context = Context
cu.mem_alloc, cu.memcpy_htod = alloc, htod
cu.memcpy_dtoh_into = lambda h, d, n: ctypes.memmove(h, d, n)
cu.memset_d8 = lambda d, v, n: ctypes.memset(d, v, n)
cu.host_alloc_mapped = host_alloc
'''
