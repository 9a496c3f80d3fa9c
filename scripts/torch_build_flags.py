#!/usr/bin/env python3
"""Describes the installed PyTorch, for building libmemforensics_torch.so without Torch's CMake
package (which insists on a CUDA toolkit).

  torch_build_flags.py           CMake set() lines; src/capture/CMakeLists.txt includes them when
                                 MEMF_TORCH_PYTHON is set.
  torch_build_flags.py --flags   "KIND VALUE" lines for a build without CMake
                                 (scripts/gpu-check.sh's direct-compiler route): "version V",
                                 "cuda ON|OFF", "include DIR" (one per directory), "define
                                 _GLIBCXX_USE_CXX11_ABI=N", "libdir DIR". One value per line, so
                                 that paths with spaces survive a `read -r kind value` loop.
"""
import glob
import os
import sys

import torch

root = os.path.dirname(torch.__file__)
includes = [os.path.join(root, "include"), os.path.join(root, "include", "torch", "csrc", "api", "include")]
# cuda_runtime_api.h: a CUDA toolkit, or the NVIDIA runtime wheel that CUDA PyTorch depends on:
# site-packages/nvidia/cuda_runtime/include (CUDA 12 wheels) or nvidia/cu13/include (CUDA 13 wheels).
cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
includes += [p for p in [os.path.join(cuda_home, "include")] if os.path.exists(os.path.join(p, "cuda_runtime_api.h"))]
for sp in sys.path:
    includes += [os.path.dirname(h) for h in sorted(glob.glob(os.path.join(sp, "nvidia", "*", "include", "cuda_runtime_api.h")))]
# Python.h: torch/csrc headers may include it.
import sysconfig
includes.append(sysconfig.get_paths()["include"])
includes = list(dict.fromkeys(includes))
version = torch.__version__.split("+")[0]
cuda = "ON" if torch.version.cuda else "OFF"
abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
libdir = os.path.join(root, "lib")
if sys.argv[1:] == ["--flags"]:
    print(f"version {version}")
    print(f"cuda {cuda}")
    for d in includes:
        print(f"include {d}")
    print(f"define _GLIBCXX_USE_CXX11_ABI={abi}")
    print(f"libdir {libdir}")
elif sys.argv[1:]:
    sys.exit(f"usage: {sys.argv[0]} [--flags]")
else:
    print(f'set(MEMF_TORCH_VERSION "{version}")')
    print(f'set(MEMF_TORCH_CUDA {cuda})')
    print(f'set(MEMF_TORCH_CXX11_ABI {abi})')
    print(f'set(MEMF_TORCH_LIBDIR "{libdir}")')
    print('set(MEMF_TORCH_INCLUDES "{}")'.format(";".join(includes)))
