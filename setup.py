"""Packaging for gluon_dynbatch: the Python package and its compiled hot paths.

``pip install .`` (or ``pip install -e .``) compiles ``gluon_dynbatch/record/_core.pyx``
(recording), ``ir/_scan.pyx``, ``plan/_agenda.pyx``, ``plan/_sums.pyx`` and
``run/_walk.pyx`` (a flush's per-node loops) with Cython (installed by pip as a
build requirement).  It needs a C compiler and the Python headers: on Debian or
Ubuntu ``apt install gcc python3-dev``.
"""
import sys

from setuptools import find_packages, setup
from setuptools.command.build_ext import build_ext


class BuildCore(build_ext):
    """``build_ext`` that says what to install when the compiler or headers are missing."""

    def run(self):
        try:
            super().run()
        except Exception as err:  # CompileError, LinkError, DistutilsExecError
            sys.stderr.write(
                "\ngluon_dynbatch: building its Cython modules failed: %s\n"
                "It needs a C compiler and the Python headers, e.g. on Debian/Ubuntu:\n"
                "    apt install gcc python3-dev\n\n" % err)
            raise


def extensions():
    from Cython.Build import cythonize
    return cythonize(["gluon_dynbatch/record/_core.pyx", "gluon_dynbatch/ir/_scan.pyx",
                      "gluon_dynbatch/plan/_agenda.pyx", "gluon_dynbatch/plan/_sums.pyx",
                      "gluon_dynbatch/run/_walk.pyx"],
                     language_level=3, quiet=True)


setup(
    name="gluon_dynbatch",
    version="0.1.0",
    description="Automatic dynamic batching for MXNet Gluon models written one sample at a time",
    packages=find_packages(include=["gluon_dynbatch", "gluon_dynbatch.*"]),
    ext_modules=extensions(),
    cmdclass={"build_ext": BuildCore},
    python_requires=">=3.8",
    install_requires=["mxnet==1.9.1", "numpy<1.24", "greenlet>=2.0"],
    extras_require={
        "test": ["pytest", "hypothesis", "scipy", "gluonnlp==0.10.0", "tqdm", "dynet38",
                 "matplotlib"],
        "examples": ["gluonnlp==0.10.0", "tqdm", "scipy", "matplotlib"],
        "plots": ["matplotlib"],
        "bench": ["matplotlib", "tqdm", "scipy", "gluonnlp==0.10.0", "dynet38"],
    },
)
