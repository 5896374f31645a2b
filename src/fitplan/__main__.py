from fitplan.cli import main

main()
