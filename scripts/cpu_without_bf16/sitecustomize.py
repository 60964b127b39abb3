"""Every Python process started with this folder on PYTHONPATH sees a CPU without native bf16/fp16 (as an
AVX2-only machine): mirrorbert.runtime.device's flag reader drops those flags when it reads /proc/cpuinfo."""
import importlib.abc
import importlib.util
import sys

TARGET = "mirrorbert.runtime.device"


def _patch(module):
    real = module._cpu_flags

    def avx2_only(cpuinfo=None):
        flags = real(cpuinfo)
        return flags - module.CPU_BF16_FLAGS - module.CPU_FP16_FLAGS if cpuinfo is None else flags

    module._cpu_flags = avx2_only


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != TARGET:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module):
            run(module)
            _patch(module)

        loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Finder())
