"""``fairclip tune``: hyperparameters by DP random search (:mod:`fairclip.sims.tune.search`), and a
tuning curve of one search per policy and target ε (:mod:`fairclip.sims.tune.curve`)."""
