"""Moved to edge_eagle.train.pipeline; this name stays for code that imports it from here."""

import sys

from . import pipeline

sys.modules[__name__] = pipeline
