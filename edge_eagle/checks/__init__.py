"""Checking tools, not run on the generation path: the torch reference forward of an EAGLE-3 /
EAGLE-3.1 drafter (reference.py), llama.cpp against it (parity.py), and converted checkpoints
against the peers' own code, vLLM's speculators and SpecForge (peers.py). `edge-eagle convert
--verify`, the trainer and the tests use them; they need torch (the `convert` extra)."""
