from ibtool.cli import main

raise SystemExit(main())
