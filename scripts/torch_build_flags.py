#!/usr/bin/env python3
"""Prints CMake set() lines describing the installed PyTorch, for building libmemforensics_torch.so
without Torch's CMake package (which insists on a CUDA toolkit). Used by src/capture/CMakeLists.txt
when MEMF_TORCH_PYTHON is set."""
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
version = torch.__version__.split("+")[0]
print(f'set(MEMF_TORCH_VERSION "{version}")')
print(f'set(MEMF_TORCH_CUDA {"ON" if torch.version.cuda else "OFF"})')
print(f'set(MEMF_TORCH_CXX11_ABI {int(torch._C._GLIBCXX_USE_CXX11_ABI)})')
print(f'set(MEMF_TORCH_LIBDIR "{os.path.join(root, "lib")}")')
print('set(MEMF_TORCH_INCLUDES "{}")'.format(";".join(dict.fromkeys(includes))))
