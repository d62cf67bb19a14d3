from draftdata.cli import main

main()
