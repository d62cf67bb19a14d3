"""What a drafter trained on draftdata's output is worth: its acceptance length measured through
a serving engine's own counters (``engine``), and simulated from the data itself, teacher-forced
in process (``simulate``). ``serve`` starts and stops a vLLM server with or without a drafter;
``metrics`` reads its spec-decode counters; ``held_out`` picks the prompts a drafter was not
trained on; ``vocab`` builds the draft vocabulary a trainer derives from token frequencies."""
