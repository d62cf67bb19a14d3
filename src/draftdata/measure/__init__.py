"""Measuring exactness instead of assuming it: validation of reconstruction against ground
truth (``validate``), the special-token audit (``audit``) and the gate for paid runs (``gate``)."""
