"""`python -m voiceapp.cli ARGS` is `voicectl ARGS` (how voicectl starts its own processes)."""
import sys

from voiceapp.cli import main

sys.exit(main())
