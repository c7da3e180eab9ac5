from jitop.cli import main

main()
