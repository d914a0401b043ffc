from backendgen.cli import main

main()
