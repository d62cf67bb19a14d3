"""The run's SQLite ledger: the only code in draftdata that speaks SQL.

``ledger.Ledger`` opens the file and owns its schema and transaction; its parts read and write
the tables: ``meta`` (the typed records one stage leaves for another, declared in ``meta``),
``prompts`` (prompts and work), ``answers`` (attempts, responses, requests in flight),
``samples`` (samples and drops), ``scores``. ``codec`` is the serialiser of records to columns;
``stats`` the read-only figures (status, throughput)."""
