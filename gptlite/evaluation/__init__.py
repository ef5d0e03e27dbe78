"""Measuring a model: loss, perplexity and bits per character or byte, on text, conversations or pairs."""
