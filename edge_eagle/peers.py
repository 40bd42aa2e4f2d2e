"""Moved to edge_eagle.checks.peers; this name stays for code that imports it from here."""

import sys

from .checks import peers

sys.modules[__name__] = peers
