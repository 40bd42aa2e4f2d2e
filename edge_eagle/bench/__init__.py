"""`edge-eagle bench`: runners, the run, and its report."""
