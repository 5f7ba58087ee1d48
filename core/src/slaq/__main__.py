from slaq.cli import main

raise SystemExit(main())
