from backendgen.cli.app import main

main()
