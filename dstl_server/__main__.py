from dstl_server.cli import main

raise SystemExit(main())
