"""``fairclip reproduce``: the seed papers' experiments, from their setup files (``builtin/``) to
tables against the papers' numbers (:mod:`fairclip.sims.reproduce.reproduction`)."""
