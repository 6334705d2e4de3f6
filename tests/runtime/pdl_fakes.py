"""A stand-in for the CUDA driver of runtime/pdl.py's launch_ex, shared by
the CPU tests of runtime/pdl.py and runtime/kernel.py."""
import ctypes


class FakeDriver:
    """Records each cuLaunchKernelEx call as plain values, read while the
    caller's structs are alive (and, given read, read(kernelParams address)
    as "values"); returns rc."""

    def __init__(self, rc=0, name=b"CUDA_ERROR_INVALID_VALUE", read=None):
        self.rc, self.name, self.read, self.calls = rc, name, read, []

    def cuLaunchKernelEx(self, config, fn, params, extra):
        c = config.contents
        attrs = [c.attrs[i] for i in range(c.numAttrs)]
        self.calls.append(dict(
            grid=(c.gridDimX, c.gridDimY, c.gridDimZ), block=(c.blockDimX, c.blockDimY, c.blockDimZ),
            smem=c.sharedMemBytes, stream=c.hStream, fn=fn, params=params, extra=extra,
            attrs=[(a.id, a.value.programmaticStreamSerializationAllowed) for a in attrs]))
        if self.read is not None:
            self.calls[-1]["values"] = self.read(params)
        return self.rc

    def cuGetErrorName(self, rc, out):
        ctypes.cast(out, ctypes.POINTER(ctypes.c_char_p))[0] = self.name
        return 0
