"""EAGLE-3 hidden states of the target model over a run's exact ids, in the trainers' offline
layouts: ``draftdata hidden-states`` (``run.capture_to``), data-parallel on Ray (``ray_data``)."""
