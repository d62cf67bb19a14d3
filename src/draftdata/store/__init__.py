"""The run's SQLite ledger: the only code in draftdata that speaks SQL.

``ledger.Ledger`` writes and reads prompts, attempts, responses, samples and drops;
``codec`` is its serialiser for records; ``stats`` the read-only figures (status, throughput)."""
