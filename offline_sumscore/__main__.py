from offline_sumscore.cli import main

main()
