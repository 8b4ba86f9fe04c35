"""Build: compile each candidate once, in isolation, into a signed cache entry that can travel."""
