"""The optional native code: the fast path (edge_eagle/_fastpath.c, loaded with ctypes by
edge_eagle/_fast.py) and the suffix index's core (edge_eagle/_suffix.c, used by edge_eagle/suffix.py).

Everything else is in pyproject.toml. optional=True: without a C compiler the install still
succeeds and edge-eagle runs its Python paths, which draft the same tokens.
"""

import sys

from setuptools import Extension, setup

args = [] if sys.platform == "win32" else ["-O2", "-std=c99"]
setup(ext_modules=[Extension("edge_eagle._fastpath", ["edge_eagle/_fastpath.c"], extra_compile_args=args,
                             define_macros=[("EE_WITH_PYTHON", "1")],
                             libraries=[] if sys.platform == "win32" else ["m"], optional=True),
                   Extension("edge_eagle._suffixcore", ["edge_eagle/_suffix.c"], extra_compile_args=args,
                             optional=True)])
