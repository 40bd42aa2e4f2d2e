"""Moved to edge_eagle.checks.reference; this name stays for code that imports it from here."""

import sys

from .checks import reference

sys.modules[__name__] = reference
