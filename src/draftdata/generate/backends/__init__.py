"""Backends that answer prompts: local engines, OpenAI-compatible APIs, token-id servers."""
