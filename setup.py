"""Build script: metadata lives in pyproject.toml; this adds the ONNX Runtime kernel bridge.

``opbridge.onnxruntime._bridge`` is a small C file that is both a CPython
extension and an ONNX Runtime custom-op library (it exports
``RegisterCustomOps``). It needs only Python's and numpy's headers: the ONNX
Runtime declarations it uses are in ``src/opbridge/onnxruntime/_ort_abi.h``. Both extensions
include ``src/opbridge/_native_kernel.h``, the ABI by which the bridge runs the native CPU kernels
without Python.
``pip install -e .`` builds it in place; in a checkout,
``python setup.py build_ext --inplace`` does the same.
"""

from __future__ import annotations

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext


class _BuildExt(build_ext):
    """build_ext that adds numpy's include directory once numpy is importable."""

    def finalize_options(self) -> None:
        super().finalize_options()
        import numpy

        self.include_dirs.append(numpy.get_include())


setup(
    ext_modules=[
        Extension(
            "opbridge.onnxruntime._bridge",
            sources=["src/opbridge/onnxruntime/_bridge.c"],
            depends=["src/opbridge/onnxruntime/_ort_abi.h", "src/opbridge/_native_kernel.h"],
            extra_compile_args=["-O2", "-fvisibility=hidden", "-Wall"],
        ),
        # each product and sum rounded as in ATen's CPU kernels (no contraction into fused multiply-adds);
        # -fno-trapping-math lets floorf vectorize
        Extension(
            "opbridge.ops._cpu_kernels",
            sources=["src/opbridge/ops/_cpu_kernels.c"],
            depends=["src/opbridge/_native_kernel.h"],
            extra_compile_args=["-O3", "-ffp-contract=off", "-fno-trapping-math", "-fvisibility=hidden", "-Wall"],
        ),
    ],
    cmdclass={"build_ext": _BuildExt},
)
