"""Packaging for gluon_dynbatch."""
from setuptools import find_packages, setup

setup(
    name="gluon_dynbatch",
    version="0.1.0",
    description="Automatic dynamic batching for MXNet Gluon models written one sample at a time",
    packages=find_packages(include=["gluon_dynbatch", "gluon_dynbatch.*"]),
    python_requires=">=3.8",
    install_requires=["mxnet==1.9.1", "numpy<1.24"],
    extras_require={
        "test": ["pytest", "hypothesis", "scipy", "gluonnlp==0.10.0", "tqdm", "dynet38",
                 "matplotlib"],
        "examples": ["gluonnlp==0.10.0", "tqdm", "scipy", "matplotlib"],
        "plots": ["matplotlib"],
        "bench": ["matplotlib", "tqdm", "scipy", "gluonnlp==0.10.0", "dynet38"],
    },
)
