"""kgen: LLM-driven kernel generation with a verdict you can trust."""
