from dlinfra.cli.app import main

main()
