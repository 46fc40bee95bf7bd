"""``python -m xtransformer {train,predict,serve,ensemble} ...``"""

import sys

from xtransformer.cli import main

sys.exit(main())
