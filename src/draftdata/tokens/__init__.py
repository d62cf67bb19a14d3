"""The tokens stage: every stored answer becomes a ``Sample`` here (``stage.TokensStage``), from
the engine's ids, ids looked up from logprobs, or the answer text reconstructed under the
format's response grammar; and the split preferences learned from ground truth."""
