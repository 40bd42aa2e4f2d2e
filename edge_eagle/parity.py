"""Moved to edge_eagle.checks.parity; this name stays for code that imports it from here."""

import sys

from .checks import parity

sys.modules[__name__] = parity
