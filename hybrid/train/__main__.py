from hybrid.train.main import main

main()
