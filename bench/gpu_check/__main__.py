from bench.gpu_check.run import main

main()
