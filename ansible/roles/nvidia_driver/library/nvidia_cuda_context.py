#!/usr/bin/python
"""Whether CUDA works on this node: cuInit, then a context on every GPU, through the driver's own libcuda (ctypes).

On an NVSwitch system whose GPUs report no fabric state (HGX A100: fabric.state is a Hopper-and-later field) this is
how a missing Fabric Manager shows: cuInit or the context fails with CUDA_ERROR_SYSTEM_NOT_READY (802), although
nvidia-smi answers. Read-only; no libcuda or no GPU is data, not a failure.

It runs on the node's own Python, EL7's 2.7 and EL8's 3.6 included (tests/ansible/test_target_python.py).
"""

from __future__ import absolute_import, division, print_function

import ctypes

from ansible.module_utils.basic import AnsibleModule

DOCUMENTATION = r"""
module: nvidia_cuda_context
short_description: Initialise CUDA and create a context on every GPU (read-only)
options:
  libcuda:
    description: The CUDA driver library, a name the loader finds or a path.
    type: str
    default: libcuda.so.1
"""

RETURN = r"""
library: {description: Whether libcuda could be loaded., type: bool, returned: always}
init: {description: "cuInit's result: 0, or a CUDA error code.", type: int, returned: always}
devices: {description: GPUs cuDeviceGetCount reports., type: int, returned: always}
contexts: {description: "cuCtxCreate's result per GPU (0: a context was created).", type: list, returned: always}
ok: {description: CUDA initialised and every GPU took a context., type: bool, returned: always}
busy: {description: "Every GPU that took no context answered out of memory (2) or devices unavailable (46): in use.", type: bool, returned: always}
error: {description: The first error by name, or empty., type: str, returned: always}
"""

# The CUDA driver API's codes a broken or busy node gives (cuda.h, CUresult). 2 and 46 are what a GPU in use answers
# (its memory taken, or exclusive-process mode with a context already on it): busy, not broken.
ERRORS = {2: "CUDA_ERROR_OUT_OF_MEMORY", 3: "CUDA_ERROR_NOT_INITIALIZED", 35: "CUDA_ERROR_INSUFFICIENT_DRIVER",
          46: "CUDA_ERROR_DEVICES_UNAVAILABLE", 100: "CUDA_ERROR_NO_DEVICE", 101: "CUDA_ERROR_INVALID_DEVICE",
          802: "CUDA_ERROR_SYSTEM_NOT_READY", 803: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH", 999: "CUDA_ERROR_UNKNOWN"}
BUSY = (2, 46)


def error_name(code):
    return "" if code == 0 else "%s (%d)" % (ERRORS.get(code, "CUDA error"), code)


def probe(cuda):
    """cuInit, cuDeviceGetCount, then cuCtxCreate/cuCtxDestroy on each device of the loaded library `cuda`."""
    init = cuda.cuInit(0)
    result = {"library": True, "init": init, "devices": 0, "contexts": [], "error": error_name(init)}
    if init == 0:
        count = ctypes.c_int(0)
        failed = cuda.cuDeviceGetCount(ctypes.byref(count))
        result["devices"] = count.value if failed == 0 else 0
        result["error"] = error_name(failed)
        for ordinal in range(result["devices"]):
            device, context = ctypes.c_int(0), ctypes.c_void_p(0)
            code = cuda.cuDeviceGet(ctypes.byref(device), ordinal) or cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device)
            if code == 0:
                cuda.cuCtxDestroy_v2(context)
            result["contexts"].append(code)
            result["error"] = result["error"] or error_name(code)
    result["ok"] = init == 0 and result["devices"] > 0 and not any(result["contexts"]) and not result["error"]
    # Every failed context was a GPU in use: the node is busy, which says nothing about its fabric.
    result["busy"] = bool(result["contexts"]) and any(result["contexts"]) and all(c in BUSY for c in result["contexts"] if c)
    return result


def main():
    module = AnsibleModule(argument_spec={"libcuda": {"type": "str", "default": "libcuda.so.1"}}, supports_check_mode=True)
    try:
        cuda = ctypes.CDLL(module.params["libcuda"])
    except OSError as exc:  # no driver userspace: data
        module.exit_json(changed=False, library=False, init=-1, devices=0, contexts=[], ok=False, busy=False, error=str(exc))
    module.exit_json(changed=False, **probe(cuda))


if __name__ == "__main__":
    main()
