"""Tools for developing and testing against draftdata: the fault-injecting OpenAI-compatible
replay server (``draftdata replay-server``)."""
