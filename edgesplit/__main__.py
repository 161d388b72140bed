from edgesplit.cli.main import main

main()
