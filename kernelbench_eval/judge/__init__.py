"""Judge: check a candidate against the reference's secret inputs, then time it against the reference.

`judging.judge` is the top (one screen); `reference` the checker's side, `candidate` the candidate's worker, `timed`
the timing stage, `refguard` the reference's protection while timed. This package imports nothing itself, so the
worker side can use its leaf modules (`timing`, `cudagraph`, `exchange`, `check`, `precision`) without the
harness's.
"""
