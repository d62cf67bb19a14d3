"""Exports: Parquet shards and manifest.json of a run (``run``, ``shards``) and the trainers'
own formats (``trainers``, with its registry of exporters)."""
