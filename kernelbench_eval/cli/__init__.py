"""The `kbeval` command line: a thin layer over the stages."""
