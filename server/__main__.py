"""`python -m server --model DIR [--draft DIR ...]`: see server/main.py."""
from server.main import main

raise SystemExit(main())
