"""``python -m xtransformer.serve ...``: ``xmc-serve``."""

from xtransformer.serve.cli import main

raise SystemExit(main())
