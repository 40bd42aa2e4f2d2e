"""The optional native fast path (edge_eagle/_fastpath.c, loaded with ctypes by edge_eagle/_fast.py).

Everything else is in pyproject.toml. optional=True: without a C compiler the install still
succeeds and edge-eagle runs its Python path, which drafts the same tokens.
"""

import sys

from setuptools import Extension, setup

args = [] if sys.platform == "win32" else ["-O2", "-std=c99"]
setup(ext_modules=[Extension("edge_eagle._fastpath", ["edge_eagle/_fastpath.c"], extra_compile_args=args,
                             define_macros=[("EE_WITH_PYTHON", "1")],
                             libraries=[] if sys.platform == "win32" else ["m"], optional=True)])
