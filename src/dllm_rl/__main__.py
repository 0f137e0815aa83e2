from dllm_rl.cli import main

raise SystemExit(main())
