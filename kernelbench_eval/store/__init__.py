"""On-disk trust: the signing key and the one lock helper for the shared cache."""
