"""Executors: where a simulated run's clients train -- in this process or in Ray actors -- and the
round loop that drives a run's server over them (:func:`fairclip.sims.executors.loop.simulate`);
also the job runner of the sweeps (:mod:`fairclip.sims.executors.jobs`) and the memory check.
The executors by name (``local``, ``ray``): :mod:`fairclip.sims.executors.registry`."""
