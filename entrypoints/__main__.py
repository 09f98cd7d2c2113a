from kubetune.entrypoints.cli import main

main()
