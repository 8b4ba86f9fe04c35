from kernelbench_eval.entry import main

main()
