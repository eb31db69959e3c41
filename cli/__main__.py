from cli.commands.startup import main  # (not cli.app: it imports every command's module)

main()
