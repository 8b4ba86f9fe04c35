"""The worker side: what runs inside a checker's (reference's) or candidate's process, and nothing else.

`main` serves the requests; `reference` and `candidate` are the two roles, each with its table of ops; the rest
is what those ops run: inputs and trials, the comparisons (`check`, `truthcheck`), per-call timing (`percall`,
`flush`, `flushkernel`, `refill`, `cudagraph`, `kbtiming`). Nothing here imports the harness's side (`judge/`,
`run/`, `cli/`); what both sides use lives in `common/`.
"""
