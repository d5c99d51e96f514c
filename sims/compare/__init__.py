"""``fairclip compare``: policies across target ε and seeds against the non-private reference, its
table, report and plots."""
