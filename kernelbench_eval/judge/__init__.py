"""Judge, the harness's side: check a candidate against the reference's secret inputs, then time it against the
reference, by asking the two workers (`worker/`) over their pipes.

`judging.judge` is the top (one screen); `reference_side` the checker's side, `candidate_run` the candidate's
worker, `timing_stage` the timing stage, `refguard` the reference's protection while timed. Nothing here runs
inside a worker, and nothing here is imported by one: what both sides use lives in `common/`.
"""
