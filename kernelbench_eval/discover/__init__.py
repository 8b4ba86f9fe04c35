"""Discover: find problems and candidates, pin the problem's bytes the reference imports."""
