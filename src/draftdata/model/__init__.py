"""The target model's files: a GGUF converted once into a transformers folder, and the command
that serves it (``transformers serve``) on loopback."""
