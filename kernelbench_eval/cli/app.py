"""`kbeval`: a thin command line over the pipeline.

Exit codes: 0 when the command completed (whatever the verdicts), 2 for usage errors (bad options,
missing folders or files).
"""

from __future__ import annotations

import typer

from kernelbench_eval.cli.inspect import problems_cmd, profile_cmd, selftest_cmd
from kernelbench_eval.cli.judge import eval_cmd, run_cmd
from kernelbench_eval.cli.results import compare_cmd, gate_cmd, report_cmd

app = typer.Typer(help=__doc__, no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  rich_markup_mode=None)

# One module a family of commands: judging (cli_judge), reading runs (cli_results), looking at problems,
# kernels and the harness (cli_inspect); the options they share are declared once in `options`.
for name, command in (("run", run_cmd), ("eval", eval_cmd), ("problems", problems_cmd), ("report", report_cmd),
                      ("compare", compare_cmd), ("gate", gate_cmd), ("profile", profile_cmd),
                      ("selftest", selftest_cmd)):
    app.command(name)(command)
