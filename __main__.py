"""``python -m comfyui_fastar``: the same command line as ``fastar``."""

from .fastar_core.cli import main

raise SystemExit(main())
