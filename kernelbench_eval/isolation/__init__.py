"""Isolation: the processes candidates and references run in, and what contains them."""
