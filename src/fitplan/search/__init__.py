"""Searching scenario variants: the recommender (cheapest or fastest plan that fits) and the capacity
tables (largest model, micro-batch or sequence that fits)."""
