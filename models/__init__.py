"""Model files: the tiny test-model factory and GGUF conversion."""
