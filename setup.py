"""The optional compiled pool: built when a C compiler is there, skipped (with a warning) when
not, so `pip install .` works either way; mocker.kv.compiled_pool falls back to Python."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "mocker.kv._cpool",
            ["mocker/kv/_cpool.c"],
            optional=True,
            extra_compile_args=["-O2"],
        )
    ]
)
