from kernelbench_eval.cli import app

app(prog_name="kbeval")
