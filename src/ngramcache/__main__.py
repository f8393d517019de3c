from ngramcache.cli.main import main

raise SystemExit(main())
