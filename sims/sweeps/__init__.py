"""What the experiments (``compare``, ``tune``, ``reproduce``) share: a sweep's folder and its run
folders, statistics across seeds, plots, trackers and the progress display."""
