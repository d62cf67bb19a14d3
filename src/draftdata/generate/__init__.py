"""Generation at scale: the runner (``runner.Runner``), conversations turn by turn, the budget,
progress, and the backends that answer (``backends``; their kinds are ``config.BACKENDS``)."""
