from kernelbench_eval.cli.entry import main

main()
