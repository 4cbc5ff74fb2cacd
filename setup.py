"""The optional compiled parts: built when a C compiler is there, skipped (with a warning) when
not, so `pip install .` works either way. The pool (mocker.kv.compiled_pool falls back to the
Python pool), the fast hash chain (mocker.kv.hashing), replay prompts' mixing
(mocker.replay.prompts), the streamed chunks' text table (mocker.api.text_table) and a pass's
plain decode tokens with the draws ahead (mocker.engine.core_pass, mocker.output_tokens) and a
tier's LRU order (mocker.tiers.lru_order) and the channels between tiers (mocker.tiers.channel)
each fall back to their Python code."""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "mocker.kv._cpool",
            ["mocker/kv/_cpool.c"],
            optional=True,
            extra_compile_args=["-O2", "-Werror=implicit-function-declaration"],
        ),
        Extension(
            "mocker.kv._chash",
            ["mocker/kv/_chash.c"],
            optional=True,
            extra_compile_args=["-O2", "-Werror=implicit-function-declaration"],
        ),
        Extension(
            "mocker.api._ctext",
            ["mocker/api/_ctext.c"],
            depends=["mocker/_cfields.h"],
            optional=True,
            extra_compile_args=["-O2", "-Werror=implicit-function-declaration"],
        ),
        Extension(
            "mocker.engine._cpass",
            ["mocker/engine/_cpass.c"],
            depends=["mocker/_cfields.h", "mocker/_cmixing.h"],
            optional=True,
            extra_compile_args=["-O2", "-Werror=implicit-function-declaration"],
        ),
        Extension(
            "mocker.tiers._clru",
            ["mocker/tiers/_clru.c"],
            optional=True,
            extra_compile_args=["-O2", "-Werror=implicit-function-declaration"],
        ),
        Extension(
            "mocker.tiers._clink",
            ["mocker/tiers/_clink.c"],
            optional=True,
            extra_compile_args=["-O2", "-Werror=implicit-function-declaration"],
        ),
        Extension(
            "mocker.replay._cprompts",
            ["mocker/replay/_cprompts.c"],
            depends=["mocker/_cmixing.h"],
            optional=True,
            extra_compile_args=["-O2", "-Werror=implicit-function-declaration"],
        ),
    ]
)
