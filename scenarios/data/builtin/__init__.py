"""The built-in datasets, one module each: its loader, its files with their SHA-256 and download
sources, and a :class:`~fairclip.scenarios.dataset_registry.DatasetSpec` registered under its name.
The registry imports every module here by itself (:mod:`fairclip.scenarios.dataset_registry`): a
new dataset is a new module, and a scenario TOML that names it."""
