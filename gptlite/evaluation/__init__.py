"""Measuring and inspecting a model: loss, perplexity and bits per character or byte; attention maps and token reports."""
