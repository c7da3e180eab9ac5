from jitop.cli import main

raise SystemExit(main())
